//! The address family a scenario runs over: one test body, run once per family, with the
//! addresses chosen here. IPv4 servers listen on loopback aliases (`127.0.<net>.<host>`);
//! IPv6 has a single loopback address, so its servers listen on ULA addresses
//! (`fd00:0:0:<net>::<host>`) that [`Family::local`] puts on the sandbox's `lo`.
use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    process::Command,
};

use socklb_agent::dataplane::{Frontend, Protocol, Scope};

use crate::{NamedServer, Sandbox, run};

/// The test's IPv6 service CIDR, blackholed in the sandbox so that a VIP the programs did
/// not translate never leaves.
pub const SERVICE_CIDR6: &str = "fd00:96::/64";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// Short tag for sandbox names: tests of both families run side by side.
    pub fn tag(self) -> &'static str {
        match self {
            Self::V4 => "4",
            Self::V6 => "6",
        }
    }

    /// A cluster IP: 10.96.0.`host` or fd00:96::`host` (in hex).
    pub fn vip(self, host: u8) -> IpAddr {
        match self {
            Self::V4 => Ipv4Addr::new(10, 96, 0, host).into(),
            Self::V6 => Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, u16::from(host)).into(),
        }
    }

    /// An internal frontend on [`vip`](Self::vip)(`host`).
    pub fn frontend(self, host: u8, port: u16, protocol: Protocol) -> Frontend {
        Frontend {
            address: self.vip(host),
            port,
            protocol,
            scope: Scope::Internal,
        }
    }

    /// An address of this sandbox's own, for servers: 127.0.`net`.`host`, or
    /// fd00:0:0:`net`::`host`, which this call adds to `lo` (and blackholes the IPv6
    /// service CIDR, once).
    pub fn local(self, sandbox: &Sandbox, net: u8, host: u8) -> IpAddr {
        match self {
            Self::V4 => Ipv4Addr::new(127, 0, net, host).into(),
            Self::V6 => {
                let address = Ipv6Addr::new(0xfd00, 0, 0, u16::from(net), 0, 0, 0, u16::from(host));
                sandbox.ipv6_ready();
                // Without duplicate address detection: usable at once, not tentative.
                run(Command::new("ip").args([
                    "-6",
                    "addr",
                    "replace",
                    &format!("{address}/128"),
                    "dev",
                    "lo",
                    "nodad",
                ]));
                address.into()
            }
        }
    }

    /// TCP servers b1..b`count` on [`local`](Self::local)(`net`, 1..=`count`):`port`.
    pub fn tcp_servers(self, sandbox: &Sandbox, net: u8, count: u8, port: u16) -> Vec<NamedServer> {
        self.servers(sandbox, (net, count, port), "b", NamedServer::tcp_at)
    }

    /// UDP servers u1..u`count` on [`local`](Self::local)(`net`, 1..=`count`):`port`.
    pub fn udp_servers(self, sandbox: &Sandbox, net: u8, count: u8, port: u16) -> Vec<NamedServer> {
        self.servers(sandbox, (net, count, port), "u", NamedServer::udp_at)
    }

    /// Servers `<prefix>1`.. on the addresses of net `net` (`count` of them), at `port`.
    fn servers(
        self,
        sandbox: &Sandbox,
        (net, count, port): (u8, u8, u16),
        prefix: &str,
        serve: fn(&str, SocketAddr) -> NamedServer,
    ) -> Vec<NamedServer> {
        (1..=count)
            .map(|i| {
                serve(
                    &format!("{prefix}{i}"),
                    SocketAddr::new(self.local(sandbox, net, i), port),
                )
            })
            .collect()
    }
}

impl Sandbox {
    /// Blackholes the IPv6 service CIDR in the sandbox (idempotent).
    fn ipv6_ready(&self) {
        run(Command::new("ip").args(["-6", "route", "replace", "blackhole", SERVICE_CIDR6]));
    }
}

/// Each scenario as one test per case: `<case>::<scenario>`, calling `<scenario>(<value>)`
/// of the invoking module, for `[case => value, ...]` and `[scenario, ...]`.
#[macro_export]
macro_rules! for_each_case {
    ([$($case:ident => $value:expr),* $(,)?], $scenarios:tt) => {
        $($crate::for_each_case!(@case $case, $value, $scenarios);)*
    };
    (@case $case:ident, $value:expr, [$($scenario:ident),* $(,)?]) => {
        mod $case {
            $(#[test]
            fn $scenario() {
                super::$scenario($value);
            })*
        }
    };
}

/// Each scenario as one test per family: `v4::<scenario>` and `v6::<scenario>`, each
/// calling `<scenario>(Family::V4 | Family::V6)` of the invoking module.
#[macro_export]
macro_rules! for_each_family {
    ($($scenario:ident),* $(,)?) => {
        $crate::for_each_case!(
            [v4 => $crate::family::Family::V4, v6 => $crate::family::Family::V6],
            [$($scenario),*]
        );
    };
}
