//! Trace events as the programs write them, decoded from the ring buffer's bytes. Pure.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use bytes::Buf;
use serde::Serialize;
use socklb_abi::{
    Ipv6Words, PROTO_TCP, PROTO_UDP, TRACE_FAMILY_V6, TRACE_REASON_AFFINITY,
    TRACE_REASON_CONNTRACK, TRACE_REASON_MAGLEV, TRACE_REASON_NO_BACKEND, TRACE_REASON_PER_SOCKET,
    TRACE_REASON_RANDOM, TRACE_REASON_REVERSE, TRACE_REASON_SNAT_EXHAUSTED,
    TRACE_REASON_SOURCE_DENIED, TRACE_SOURCE_CONNECT, TRACE_SOURCE_EXTERNAL, TRACE_SOURCE_POD,
    TRACE_SOURCE_REVERSE, TRACE_SOURCE_SENDMSG, TraceEvent, ipv6_octets,
};

use crate::terminal::printable;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "a trace event of {got} bytes, expected {expected}: the agent and the programs disagree on \
     the layout (restart the agent of this version, or use the `socklb` that loaded them)"
)]
pub struct DecodeError {
    got: usize,
    expected: usize,
}

/// Decodes one ring buffer record: the fields of [`TraceEvent`] in order, native byte order
/// (the programs run on this machine); addresses and ports stay in network order.
pub fn decode(mut record: &[u8]) -> Result<TraceEvent, DecodeError> {
    let expected = size_of::<TraceEvent>();
    if record.len() != expected {
        return Err(DecodeError {
            got: record.len(),
            expected,
        });
    }
    let buf = &mut record;
    Ok(TraceEvent {
        time_ns: buf.get_u64_ne(),
        socket_cookie: buf.get_u64_ne(),
        netns_cookie: buf.get_u64_ne(),
        cgroup_id: buf.get_u64_ne(),
        pid: buf.get_u32_ne(),
        service_id: buf.get_u32_ne(),
        client_address: words(buf),
        frontend_address: words(buf),
        backend_address: words(buf),
        snat_address: words(buf),
        client_port: buf.get_u16_ne(),
        frontend_port: buf.get_u16_ne(),
        backend_port: buf.get_u16_ne(),
        snat_port: buf.get_u16_ne(),
        slot: buf.get_u16_ne(),
        count: buf.get_u16_ne(),
        protocol: buf.get_u8(),
        source: buf.get_u8(),
        reason: buf.get_u8(),
        family: buf.get_u8(),
        ifindex: buf.get_u32_ne(),
        pad: buf.get_u32_ne(),
    })
}

/// An address's four words, each as stored (network order bytes in native-order words).
fn words(buf: &mut &[u8]) -> Ipv6Words {
    [
        buf.get_u32_ne(),
        buf.get_u32_ne(),
        buf.get_u32_ne(),
        buf.get_u32_ne(),
    ]
}

/// Where an event came from.
pub fn source_name(source: u8) -> &'static str {
    match source {
        TRACE_SOURCE_CONNECT => "connect",
        TRACE_SOURCE_SENDMSG => "sendmsg",
        TRACE_SOURCE_REVERSE => "reverse",
        TRACE_SOURCE_EXTERNAL => "external",
        TRACE_SOURCE_POD => "pod",
        _ => "unknown",
    }
}

/// Why the backend was chosen, as the output names it.
pub fn reason_name(reason: u8) -> &'static str {
    match reason {
        TRACE_REASON_RANDOM => "random",
        TRACE_REASON_PER_SOCKET => "per-socket",
        TRACE_REASON_AFFINITY => "affinity",
        TRACE_REASON_NO_BACKEND => "no-backend",
        TRACE_REASON_MAGLEV => "maglev",
        TRACE_REASON_SOURCE_DENIED => "source-denied",
        TRACE_REASON_SNAT_EXHAUSTED => "snat-exhausted",
        TRACE_REASON_CONNTRACK => "conntrack",
        TRACE_REASON_REVERSE => "reverse",
        _ => "unknown",
    }
}

fn protocol_name(protocol: u8) -> &'static str {
    match protocol {
        PROTO_TCP => "tcp",
        PROTO_UDP => "udp",
        _ => "other",
    }
}

/// A socket address of the event's family from the network-order fields; `None` when not
/// set. Shown as `addr:port` or `[addr]:port`.
fn endpoint(family: u8, address: Ipv6Words, port: u16) -> Option<SocketAddr> {
    if address == [0; 4] {
        return None;
    }
    let ip = if family == TRACE_FAMILY_V6 {
        IpAddr::V6(Ipv6Addr::from(ipv6_octets(address)))
    } else {
        IpAddr::V4(Ipv4Addr::from(u32::from_be(address[3])))
    };
    Some(SocketAddr::new(ip, u16::from_be(port)))
}

/// How a device whose index has no name here is shown.
pub fn unnamed_device(ifindex: u32) -> String {
    format!("if{ifindex}")
}

/// The Service a frontend belongs to, from the names map.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Service {
    pub namespace: String,
    pub name: String,
    pub port: String,
}

/// The calling process of a socket event.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Process {
    pub pid: u32,
    /// From /proc when the event is read: empty if the process is gone.
    pub comm: String,
    pub netns_cookie: u64,
    pub cgroup_id: u64,
    /// Below the cgroup v2 mount; empty if the cgroup is gone.
    pub cgroup: String,
    pub socket_cookie: u64,
}

/// One event as `socklb trace` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Shown {
    /// RFC 3339, microseconds.
    pub time: String,
    pub source: &'static str,
    pub protocol: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<Process>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<SocketAddr>,
    /// The device a packet arrived on, by name in this process's network namespace
    /// (`if<N>` for an index without one there); absent for socket events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    pub frontend: Option<SocketAddr>,
    pub service: Option<Service>,
    pub service_id: u32,
    pub backend: Option<SocketAddr>,
    /// The source the backend sees of a flow SNATed to this node (the node's address and
    /// the flow's SNAT port); absent when the flow keeps its client's address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snat: Option<SocketAddr>,
    pub reason: &'static str,
    /// The slot chosen (1-based) of `count`; 0 when none was.
    pub slot: u16,
    pub count: u16,
}

impl Shown {
    /// The event's fields; the session adds time, process details, the device's name and
    /// the Service.
    pub fn new(event: &TraceEvent, time: String, service: Option<Service>) -> Self {
        // Packets (from outside, or from a pod device) have no process, but a device.
        let packet = matches!(event.source, TRACE_SOURCE_EXTERNAL | TRACE_SOURCE_POD);
        Self {
            time,
            source: source_name(event.source),
            protocol: protocol_name(event.protocol),
            process: (!packet).then(|| Process {
                pid: event.pid,
                netns_cookie: event.netns_cookie,
                cgroup_id: event.cgroup_id,
                socket_cookie: event.socket_cookie,
                ..Process::default()
            }),
            client: endpoint(event.family, event.client_address, event.client_port),
            device: (packet && event.ifindex != 0).then(|| unnamed_device(event.ifindex)),
            frontend: endpoint(event.family, event.frontend_address, event.frontend_port),
            service,
            service_id: event.service_id,
            backend: endpoint(event.family, event.backend_address, event.backend_port),
            // Port 0: no SNAT source (the programs may leave an address there).
            snat: endpoint(event.family, event.snat_address, event.snat_port)
                .filter(|_| event.snat_port != 0),
            reason: reason_name(event.reason),
            slot: event.slot,
            count: event.count,
        }
    }

    /// One line: when, who (and on which device, for a packet), what was asked, what it
    /// became (and from which source, if SNATed), and why.
    pub fn line(&self) -> String {
        let who = match (&self.process, self.client) {
            (Some(p), _) => format!(
                "pid {} ({}) netns {} cgroup {}",
                p.pid,
                if p.comm.is_empty() {
                    "?".into()
                } else {
                    printable(&p.comm)
                },
                p.netns_cookie,
                if p.cgroup.is_empty() {
                    "?".into()
                } else {
                    printable(&p.cgroup)
                },
            ),
            (None, Some(client)) => format!("client {client}"),
            (None, None) => String::from("?"),
        };
        let who = match &self.device {
            Some(device) => format!("{who} on {}", printable(device)),
            None => who,
        };
        let frontend = self
            .frontend
            .map_or_else(|| "?".to_owned(), |f| f.to_string());
        let service = self.service.as_ref().map_or_else(
            || format!("service id {}", self.service_id),
            |s| {
                let (namespace, name) = (printable(&s.namespace), printable(&s.name));
                if s.port.is_empty() {
                    format!("{namespace}/{name}")
                } else {
                    format!("{namespace}/{name}:{}", printable(&s.port))
                }
            },
        );
        let mut backend = self
            .backend
            .map_or_else(|| "-".to_owned(), |b| b.to_string());
        if let Some(snat) = self.snat {
            backend = format!("{backend} snat {snat}");
        }
        let why = match (self.reason, self.slot) {
            ("random" | "per-socket" | "affinity" | "maglev", slot) if slot > 0 => {
                format!("{} slot {} of {}", self.reason, slot, self.count)
            }
            (reason, _) => reason.to_owned(),
        };
        format!(
            "{} {:<8} {} {} {frontend} ({service}) -> {backend} {why}",
            self.time, self.source, who, self.protocol
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> TraceEvent {
        TraceEvent {
            time_ns: 42,
            socket_cookie: 7,
            netns_cookie: 4_026_531_840,
            cgroup_id: 99,
            pid: 1234,
            service_id: 3,
            frontend_address: [0, 0, 0, u32::from(Ipv4Addr::new(10, 96, 0, 10)).to_be()],
            backend_address: [0, 0, 0, u32::from(Ipv4Addr::new(10, 0, 1, 5)).to_be()],
            client_port: 0,
            frontend_port: 80u16.to_be(),
            backend_port: 8080u16.to_be(),
            slot: 2,
            count: 3,
            protocol: PROTO_TCP,
            source: TRACE_SOURCE_CONNECT,
            reason: TRACE_REASON_RANDOM,
            family: socklb_abi::TRACE_FAMILY_V4,
            ..TraceEvent::default()
        }
    }

    fn words(address: &str) -> Ipv6Words {
        socklb_abi::ipv6_words(address.parse::<Ipv6Addr>().expect("address").octets())
    }

    fn bytes_of(event: &TraceEvent) -> Vec<u8> {
        // SAFETY: TraceEvent is repr(C), integers only, every padding byte a field.
        unsafe {
            std::slice::from_raw_parts(
                std::ptr::from_ref(event).cast::<u8>(),
                size_of::<TraceEvent>(),
            )
        }
        .to_vec()
    }

    /// [`sample`] as a flow from outside SNATed to a remote backend.
    fn snated() -> TraceEvent {
        TraceEvent {
            source: TRACE_SOURCE_EXTERNAL,
            client_address: [0, 0, 0, u32::from(Ipv4Addr::new(10, 77, 0, 10)).to_be()],
            client_port: 51000u16.to_be(),
            snat_address: [0, 0, 0, u32::from(Ipv4Addr::new(10, 77, 0, 1)).to_be()],
            snat_port: 61234u16.to_be(),
            ifindex: 7,
            ..sample()
        }
    }

    #[test]
    fn a_record_decodes_to_the_event_the_programs_wrote() {
        for event in [sample(), snated()] {
            assert_eq!(decode(&bytes_of(&event)), Ok(event));
        }
    }

    #[test]
    fn a_record_of_another_size_is_refused_with_the_sizes() {
        let bytes = bytes_of(&sample());
        let error = decode(&bytes[..bytes.len() - 8]).expect_err("short record");
        assert_eq!(
            error,
            DecodeError {
                got: 120,
                expected: 128
            }
        );
    }

    #[test]
    fn a_line_says_who_what_and_why() {
        let service = Service {
            namespace: "default".into(),
            name: "web".into(),
            port: "http".into(),
        };
        let mut shown = Shown::new(&sample(), "T".into(), Some(service));
        if let Some(process) = shown.process.as_mut() {
            process.comm = "curl".into();
            process.cgroup = "/pods/a".into();
        }
        assert_eq!(
            shown.line(),
            "T connect  pid 1234 (curl) netns 4026531840 cgroup /pods/a tcp 10.96.0.10:80 \
             (default/web:http) -> 10.0.1.5:8080 random slot 2 of 3"
        );
        let refused = TraceEvent {
            reason: TRACE_REASON_NO_BACKEND,
            backend_address: [0; 4],
            slot: 0,
            ..sample()
        };
        assert!(
            Shown::new(&refused, "T".into(), None)
                .line()
                .ends_with("(service id 3) -> - no-backend")
        );
    }

    #[test]
    fn a_snated_flow_shows_the_source_its_backend_sees_and_another_none() {
        let shown = Shown::new(&snated(), "T".into(), None);
        assert_eq!(
            shown.line(),
            "T external client 10.77.0.10:51000 on if7 tcp 10.96.0.10:80 (service id 3) -> \
             10.0.1.5:8080 snat 10.77.0.1:61234 random slot 2 of 3"
        );
        let json = serde_json::to_value(&shown).expect("json");
        assert_eq!(json["snat"], "10.77.0.1:61234", "{json}");

        let kept = TraceEvent {
            snat_address: [0; 4],
            snat_port: 0,
            ..snated()
        };
        let shown = Shown::new(&kept, "T".into(), None);
        assert!(!shown.line().contains("snat"), "{}", shown.line());
        let json = serde_json::to_value(&shown).expect("json");
        assert!(json.get("snat").is_none(), "{json}");
    }

    #[test]
    fn a_packet_shows_its_device_and_a_socket_event_none() {
        let mut shown = Shown::new(&snated(), "T".into(), None);
        assert_eq!(
            shown.device.as_deref(),
            Some("if7"),
            "the index without its name"
        );
        shown.device = Some("vm1".into());
        assert!(
            shown
                .line()
                .starts_with("T external client 10.77.0.10:51000 on vm1 tcp "),
            "{}",
            shown.line()
        );
        let json = serde_json::to_value(&shown).expect("json");
        assert_eq!(json["device"], "vm1", "{json}");

        let pod = TraceEvent {
            source: TRACE_SOURCE_POD,
            ..snated()
        };
        let shown = Shown::new(&pod, "T".into(), None);
        assert!(
            shown
                .line()
                .starts_with("T pod      client 10.77.0.10:51000 on if7 tcp "),
            "{}",
            shown.line()
        );

        // A socket event has no device, even if the field were set.
        let socket = TraceEvent {
            ifindex: 7,
            ..sample()
        };
        let shown = Shown::new(&socket, "T".into(), None);
        assert_eq!(shown.device, None);
        assert!(!shown.line().contains(" on "), "{}", shown.line());
        let json = serde_json::to_value(&shown).expect("json");
        assert!(json.get("device").is_none(), "{json}");
    }

    #[test]
    fn a_device_name_reaches_the_terminal_escaped() {
        let mut shown = Shown::new(&snated(), "T".into(), None);
        // Linux refuses only '/', ':' and white space in a device's name.
        shown.device = Some("tap\x1b[2J".into());
        let line = shown.line();
        assert!(line.contains("on tap\\x1b[2J tcp"), "{line}");
        assert!(!line.contains('\x1b'), "{line}");
    }

    #[test]
    fn process_and_service_names_reach_the_terminal_escaped() {
        let service = Service {
            namespace: "default".into(),
            name: "web\u{202e}".into(),
            port: "\x1b]0;pwned\x07".into(),
        };
        let mut event = Shown::new(&sample(), "T".into(), Some(service));
        if let Some(process) = event.process.as_mut() {
            process.comm = "\x1b[2Jx".into();
            process.cgroup = "/a\nb".into();
        }
        let line = event.line();
        assert!(
            line.contains("(\\x1b[2Jx)") && line.contains("cgroup /a\\x0ab"),
            "{line}"
        );
        assert!(
            line.contains("(default/web\\u{202e}:\\x1b]0;pwned\\x07)"),
            "{line}"
        );
        assert!(
            !line.contains('\u{202e}') && !line.contains('\x07'),
            "{line}"
        );
        assert!(!line.contains('\x1b') && !line.contains('\n'), "{line}");
        // JSON keeps the name as it is: serde escapes it.
        let json = serde_json::to_string(&event).expect("json");
        assert!(json.contains("\\u001b[2Jx"), "{json}");
    }

    #[test]
    fn ipv6_addresses_show_in_brackets() {
        let event = TraceEvent {
            source: TRACE_SOURCE_EXTERNAL,
            family: TRACE_FAMILY_V6,
            client_address: words("fd00:77::10"),
            client_port: 40000u16.to_be(),
            frontend_address: words("fd00:96::a"),
            backend_address: words("fd00:244:1::10"),
            snat_address: words("fd00:77::1"),
            snat_port: 61234u16.to_be(),
            ..sample()
        };
        let shown = Shown::new(&event, "T".into(), None);
        assert_eq!(
            shown.line(),
            "T external client [fd00:77::10]:40000 tcp [fd00:96::a]:80 (service id 3) -> \
             [fd00:244:1::10]:8080 snat [fd00:77::1]:61234 random slot 2 of 3"
        );
        let json = serde_json::to_value(&shown).expect("json");
        assert_eq!(json["frontend"], "[fd00:96::a]:80");
        assert_eq!(json["backend"], "[fd00:244:1::10]:8080");
        assert_eq!(json["snat"], "[fd00:77::1]:61234");
    }
}
