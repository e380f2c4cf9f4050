//! Typed access to `bpf_sock_addr`. The verifier only accepts whole-u32 reads and writes of
//! these fields, so every access goes through here.
//!
//! An IPv6 socket that talks to an IPv4-mapped address (`::ffff:a.b.c.d`), as dual-stack
//! clients (Java's default, for one) do for IPv4 services, takes the IPv4 path: the IPv4
//! address is the last word of `user_ip6`. Any other IPv6 address is a native one, whose
//! four words are copied as they are (the maps hold them in the same shape).
use aya_ebpf::{EbpfContext, bindings::bpf_sock_addr, helpers, programs::SockAddrContext};
use socklb_abi::Ipv6Words;

/// `::ffff:0:0/96` as the first three words of `user_ip6`, read as host-order u32s.
const V4_MAPPED_PREFIX: [u32; 3] = [0, 0, u32::from_ne_bytes([0, 0, 0xff, 0xff])];

#[derive(Clone, Copy)]
enum Family {
    V4,
    /// An AF_INET6 socket with an IPv4-mapped address.
    V4MappedV6,
    /// An AF_INET6 socket with a native IPv6 address.
    V6,
}

/// What an AF_INET6 hook has in hand.
pub enum Inet6<'a> {
    /// An IPv4-mapped address: the IPv4 maps serve it.
    V4Mapped(SockAddr<'a>),
    Native(SockAddr<'a>),
}

pub struct SockAddr<'a> {
    ctx: &'a SockAddrContext,
    family: Family,
}

impl<'a> SockAddr<'a> {
    /// An AF_INET hook (connect4, sendmsg4, ...).
    pub fn v4(ctx: &'a SockAddrContext) -> Self {
        Self {
            ctx,
            family: Family::V4,
        }
    }

    /// An AF_INET6 hook (connect6, sendmsg6, ...): which family's maps serve the address.
    #[inline(always)]
    pub fn v6(ctx: &'a SockAddrContext) -> Inet6<'a> {
        // SAFETY: the kernel passes a valid context for the whole program run.
        let ip6 = unsafe { (*ctx.sock_addr).user_ip6 };
        if ip6[0] == V4_MAPPED_PREFIX[0]
            && ip6[1] == V4_MAPPED_PREFIX[1]
            && ip6[2] == V4_MAPPED_PREFIX[2]
        {
            Inet6::V4Mapped(Self {
                ctx,
                family: Family::V4MappedV6,
            })
        } else {
            Inet6::Native(Self {
                ctx,
                family: Family::V6,
            })
        }
    }

    /// The hook's context, for helpers that take it (socket storage).
    pub fn context(&self) -> &SockAddrContext {
        self.ctx
    }

    fn raw(&self) -> *mut bpf_sock_addr {
        self.ctx.sock_addr
    }

    /// Destination (connect, sendmsg) or peer (recvmsg, getpeername) IPv4 address, network
    /// order (of an IPv4-mapped address: its last word).
    #[inline(always)]
    pub fn address(&self) -> u32 {
        // SAFETY: the kernel passes a valid context for the whole program run.
        unsafe {
            match self.family {
                Family::V4 => (*self.raw()).user_ip4,
                Family::V4MappedV6 | Family::V6 => (*self.raw()).user_ip6[3],
            }
        }
    }

    /// Destination or peer IPv6 address, word by word (each a whole u32 access).
    #[inline(always)]
    pub fn address6(&self) -> Ipv6Words {
        let ip6 = self.ip6();
        // SAFETY: field pointers into the valid context.
        unsafe {
            [
                ip6.read_volatile(),
                ip6.add(1).read_volatile(),
                ip6.add(2).read_volatile(),
                ip6.add(3).read_volatile(),
            ]
        }
    }

    fn ip6(&self) -> *mut u32 {
        // SAFETY: a field pointer of the valid context; nothing is read here.
        unsafe { core::ptr::addr_of_mut!((*self.raw()).user_ip6).cast::<u32>() }
    }

    /// Destination or peer port, network order (the u32 field holds a be16).
    #[inline(always)]
    pub fn port(&self) -> u16 {
        // SAFETY: as above.
        unsafe { (*self.raw()).user_port as u16 }
    }

    #[inline(always)]
    pub fn protocol(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.raw()).protocol }
    }

    #[inline(always)]
    pub fn set_destination(&self, address: u32, port: u16) {
        // SAFETY: as above; both fields are writable in every hook this crate attaches.
        unsafe {
            match self.family {
                Family::V4 => (*self.raw()).user_ip4 = address,
                // The ::ffff: prefix stays: the socket still talks to an IPv4 peer.
                Family::V4MappedV6 | Family::V6 => (*self.raw()).user_ip6[3] = address,
            }
            (*self.raw()).user_port = u32::from(port);
        }
    }

    /// Rewrites the IPv6 destination (or the peer shown), one whole word at a time.
    #[inline(always)]
    pub fn set_destination6(&self, address: Ipv6Words, port: u16) {
        let ip6 = self.ip6();
        // SAFETY: field pointers into the valid context; writable in every hook here.
        unsafe {
            ip6.write_volatile(address[0]);
            ip6.add(1).write_volatile(address[1]);
            ip6.add(2).write_volatile(address[2]);
            ip6.add(3).write_volatile(address[3]);
            (*self.raw()).user_port = u32::from(port);
        }
    }

    #[inline(always)]
    pub fn socket_cookie(&self) -> u64 {
        // SAFETY: the helper only reads the socket behind the context.
        unsafe { helpers::bpf_get_socket_cookie(self.ctx.as_ptr()) }
    }

    #[inline(always)]
    pub fn netns_cookie(&self) -> u64 {
        // SAFETY: as above.
        unsafe { helpers::bpf_get_netns_cookie(self.ctx.as_ptr()) }
    }
}
