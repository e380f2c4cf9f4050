//! Typed access to `bpf_sock_addr`. The verifier only accepts whole-u32 reads and writes of
//! these fields, so every access goes through here.
//!
//! IPv6 sockets are served when they talk to IPv4-mapped addresses (`::ffff:a.b.c.d`), as
//! dual-stack clients (Java's default, for one) do for IPv4 services: the IPv4 address is
//! the last word of `user_ip6`, and everything else is the IPv4 path.
use aya_ebpf::{EbpfContext, bindings::bpf_sock_addr, helpers, programs::SockAddrContext};

/// `::ffff:0:0/96` as the first three words of `user_ip6`, read as host-order u32s.
const V4_MAPPED_PREFIX: [u32; 3] = [0, 0, u32::from_ne_bytes([0, 0, 0xff, 0xff])];

#[derive(Clone, Copy)]
enum Family {
    V4,
    /// An AF_INET6 socket with an IPv4-mapped address.
    V4MappedV6,
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

    /// An AF_INET6 hook: only IPv4-mapped addresses are ours; others are left alone.
    #[inline(always)]
    pub fn v4_mapped(ctx: &'a SockAddrContext) -> Option<Self> {
        // SAFETY: the kernel passes a valid context for the whole program run.
        let ip6 = unsafe { (*ctx.sock_addr).user_ip6 };
        (ip6[0] == V4_MAPPED_PREFIX[0]
            && ip6[1] == V4_MAPPED_PREFIX[1]
            && ip6[2] == V4_MAPPED_PREFIX[2])
            .then_some(Self {
                ctx,
                family: Family::V4MappedV6,
            })
    }

    /// The hook's context, for helpers that take it (socket storage).
    pub fn context(&self) -> &SockAddrContext {
        self.ctx
    }

    fn raw(&self) -> *mut bpf_sock_addr {
        self.ctx.sock_addr
    }

    /// Destination (connect, sendmsg) or peer (recvmsg, getpeername) address, network order.
    #[inline(always)]
    pub fn address(&self) -> u32 {
        // SAFETY: the kernel passes a valid context for the whole program run.
        unsafe {
            match self.family {
                Family::V4 => (*self.raw()).user_ip4,
                Family::V4MappedV6 => (*self.raw()).user_ip6[3],
            }
        }
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
                Family::V4MappedV6 => (*self.raw()).user_ip6[3] = address,
            }
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
