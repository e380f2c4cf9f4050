//! Addresses as the maps hold them: IPv4 in one word, IPv6 in four (network byte order).

/// An IPv6 address as the programs hold it: the 16 bytes in network order, as four words
/// (the shape of `bpf_sock_addr.user_ip6`, so a socket address is copied, never converted).
/// The agent converts with [`ipv6_words`] and [`ipv6_octets`].
pub type Ipv6Words = [u32; 4];

/// The words of an IPv6 address given as its 16 octets (network order).
#[must_use]
pub const fn ipv6_words(octets: [u8; 16]) -> Ipv6Words {
    let mut words = [0u32; 4];
    let mut i = 0;
    while i < 4 {
        words[i] = u32::from_ne_bytes([
            octets[4 * i],
            octets[4 * i + 1],
            octets[4 * i + 2],
            octets[4 * i + 3],
        ]);
        i += 1;
    }
    words
}

/// The 16 octets (network order) of an IPv6 address held as [`Ipv6Words`].
#[must_use]
pub const fn ipv6_octets(words: Ipv6Words) -> [u8; 16] {
    let mut octets = [0u8; 16];
    let mut i = 0;
    while i < 4 {
        let bytes = words[i].to_ne_bytes();
        octets[4 * i] = bytes[0];
        octets[4 * i + 1] = bytes[1];
        octets[4 * i + 2] = bytes[2];
        octets[4 * i + 3] = bytes[3];
        i += 1;
    }
    octets
}
