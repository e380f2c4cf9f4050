//! Typed access to `bpf_sock_addr`. The verifier only accepts whole-u32 reads and writes of
//! these fields, so every access goes through here.
use aya_ebpf::{EbpfContext, bindings::bpf_sock_addr, helpers, programs::SockAddrContext};

pub struct SockAddr<'a> {
    ctx: &'a SockAddrContext,
}

impl<'a> SockAddr<'a> {
    pub fn new(ctx: &'a SockAddrContext) -> Self {
        Self { ctx }
    }

    fn raw(&self) -> *mut bpf_sock_addr {
        self.ctx.sock_addr
    }

    /// Destination (connect, sendmsg) or peer (recvmsg, getpeername) address, network order.
    #[inline(always)]
    pub fn address(&self) -> u32 {
        // SAFETY: the kernel passes a valid context for the whole program run.
        unsafe { (*self.raw()).user_ip4 }
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
            (*self.raw()).user_ip4 = address;
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
