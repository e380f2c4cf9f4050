//! The TC entries of the per-packet path (`flow`), one family each in a stack frame of its
//! own:
//! - `socklb_tc_in`, ingress of the external devices: packets from outside to NodePorts,
//!   LoadBalancer IPs and externalIPs, and the replies of SNATed flows.
//! - `socklb_tc_pod`, ingress of pod devices (their host side): packets from a workload
//!   whose sockets the socket hooks leave alone to internal frontends, and the replies of
//!   hairpin flows.
//! - `socklb_tc_out`, egress of both: the replies of backends, shown as coming from the
//!   frontend.
//!
//! Each entry screens an IPv4 packet first, in line (`fast`): one of no translated flow to no
//! frontend passes there; an ingress packet of a known flow takes the fast path. ICMP
//! errors about a flow are translated back (`icmp`); what is neither TCP nor UDP nor such
//! an error (neighbour discovery, ARP) passes untouched.
use aya_ebpf::{macros::classifier, programs::TcContext};
use socklb_abi::Ipv6Words;

use crate::{
    conntrack,
    deliver::{TC_ACT_OK, TOO_BIG},
    family::{V4, V6},
    fast::{self, Screen},
    flow::{EXPIRED, NOT_TCP_OR_UDP, REFUSE, icmp_error, try_egress, try_ingress, verdict},
    maps::NODE,
    packet::{self, ETH_P_IP, ETH_P_IPV6, Packet},
    reject,
    side::{External, Pod, Side},
};

#[classifier]
pub fn socklb_tc_in(ctx: TcContext) -> i32 {
    ingress::<External>(&ctx)
}

#[classifier]
pub fn socklb_tc_pod(ctx: TcContext) -> i32 {
    ingress::<Pod>(&ctx)
}

#[inline(always)]
fn ingress<S: Side>(ctx: &TcContext) -> i32 {
    match packet::ether_type(ctx) {
        Some(ETH_P_IP) => match fast::screen_ingress4(ctx) {
            Screen::Pass
                if !(S::DIRECT
                    && conntrack::delivers_direct(NODE.get(0))
                    && fast::may_be_direct_reply4(ctx)) =>
            {
                TC_ACT_OK
            }
            screen => match fast_or_full4::<S>(ctx, screen) {
                NOT_TCP_OR_UDP => icmp_error::<V4>(ctx, true),
                REFUSE => reject::refuse4::<S>(ctx),
                EXPIRED => reject::expired4(ctx),
                code if code <= TOO_BIG => reject::too_big4(ctx, (TOO_BIG - code) as u16),
                verdict => verdict,
            },
        },
        Some(ETH_P_IPV6) => match ingress6::<S>(ctx) {
            NOT_TCP_OR_UDP => icmp_error::<V6>(ctx, true),
            REFUSE => reject::refuse6::<S>(ctx),
            EXPIRED => reject::expired6(ctx),
            code if code <= TOO_BIG => reject::too_big6(ctx, (TOO_BIG - code) as u16),
            verdict => verdict,
        },
        _ => TC_ACT_OK,
    }
}

/// The fast path's verdict for a packet the screen sent there, or the full path's for a
/// packet it leaves. Two sibling calls: their stack frames are not added up.
#[inline(always)]
fn fast_or_full4<S: Side>(ctx: &TcContext, screen: Screen) -> i32 {
    if screen == Screen::Fast {
        match fast::ingress4::<S>(ctx) {
            fast::FULL => {}
            verdict => return verdict,
        }
    }
    ingress4::<S>(ctx)
}

/// Each family out of line, in a stack frame of its own: the verifier bounds the stack of
/// a call chain, which then holds one family's path, not both.
#[inline(never)]
fn ingress4<S: Side>(ctx: &TcContext) -> i32 {
    let Some(mut packet) = Packet::<u32>::parse(ctx) else {
        return NOT_TCP_OR_UDP;
    };
    verdict(try_ingress::<V4, S>(ctx, &mut packet), &packet)
}

#[inline(never)]
fn ingress6<S: Side>(ctx: &TcContext) -> i32 {
    let mut packet = Packet::<Ipv6Words>::empty(ctx);
    if !Packet::parse_into(ctx, &mut packet) {
        return NOT_TCP_OR_UDP;
    }
    verdict(try_ingress::<V6, S>(ctx, &mut packet), &packet)
}

#[classifier]
pub fn socklb_tc_out(ctx: TcContext) -> i32 {
    match packet::ether_type(&ctx) {
        Some(ETH_P_IP) if fast::egress_passes4(&ctx) => TC_ACT_OK,
        Some(ETH_P_IP) => match egress4(&ctx) {
            NOT_TCP_OR_UDP => icmp_error::<V4>(&ctx, false),
            verdict => verdict,
        },
        Some(ETH_P_IPV6) => match egress6(&ctx) {
            NOT_TCP_OR_UDP => icmp_error::<V6>(&ctx, false),
            verdict => verdict,
        },
        _ => TC_ACT_OK,
    }
}

#[inline(never)]
fn egress4(ctx: &TcContext) -> i32 {
    // A plain packet comes here after the entry's screen found its slot marked.
    let (mut packet, screened) = match Packet::<u32>::parse_plain(ctx) {
        Some(packet) => (packet, true),
        None => match Packet::<u32>::parse_unusual(ctx) {
            Some(packet) => (packet, false),
            None => return NOT_TCP_OR_UDP,
        },
    };
    verdict(try_egress::<V4>(&mut packet, screened), &packet)
}

#[inline(never)]
fn egress6(ctx: &TcContext) -> i32 {
    let mut packet = Packet::<Ipv6Words>::empty(ctx);
    if !Packet::parse_into(ctx, &mut packet) {
        return NOT_TCP_OR_UDP;
    }
    verdict(try_egress::<V6>(&mut packet, false), &packet)
}
