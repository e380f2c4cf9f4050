//! kube-proxy's rules for the benchmark's services, as its two modes write them: the same
//! chains, maps, matches and order, so that the kernel does the same work per packet and
//! holds a ruleset of the same size.
pub mod iptables;
pub mod nftables;

/// kube-proxy's masquerade mark.
pub const MASQ_MARK: &str = "0x4000";
/// The service CIDR (`--service-cluster-ip-range`).
pub const SERVICE_CIDR: &str = "10.96.0.0/12";

/// What kube-proxy knows of its node besides the services.
#[derive(Clone, Copy)]
pub struct Config {
    /// The local-traffic detector's pod CIDR: traffic from it is a pod's (not masqueraded
    /// to a ClusterIP).
    pub pod_cidr: &'static str,
    /// The node's address: where NodePorts are served (`--nodeport-addresses primary`).
    pub node_ip: &'static str,
}

/// Chain names: kube-proxy hashes with SHA-256 and base32 (KUBE-SVC-<16 chars>,
/// service-<8 chars>-ns/name/tcp/port). Same alphabet and lengths here, from FNV-1a; the
/// names only matter to the size of the ruleset, not to the per-packet work.
pub fn name_hash(text: &str, chars: usize) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let fnv = |seed: u64| {
        text.bytes().fold(seed, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    let bits = (u128::from(fnv(0xcbf2_9ce4_8422_2325)) << 64) | u128::from(fnv(0x8422_2325));
    (0..chars)
        .map(|i| char::from(ALPHABET[((bits >> (5 * i)) & 31) as usize]))
        .collect()
}
