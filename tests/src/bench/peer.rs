//! The four ways a connection reaches a service, measured side by side.

/// What translates the service address: nothing (the client connects to the endpoint:
/// the floor), socklb, or kube-proxy's iptables or nftables rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Peer {
    Direct,
    Socklb,
    Iptables,
    Nftables,
}

pub const PEERS: [Peer; 4] = [Peer::Direct, Peer::Socklb, Peer::Iptables, Peer::Nftables];

impl Peer {
    pub fn name(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Socklb => "socklb",
            Self::Iptables => "iptables",
            Self::Nftables => "nftables",
        }
    }
}
