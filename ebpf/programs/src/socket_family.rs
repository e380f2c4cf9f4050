//! The address families of the socket programs. `socket` is written once over [`Family`]; each
//! family says which maps serve it and how its map entries are read and built. Both
//! implementations are a few lines of field copies that the compiler inlines, so the IPv4
//! path does the same work as before IPv6 existed.
use socklb_abi::{
    Ipv6Words, ReverseEntry, ReverseEntry6, ReverseKey, ReverseKey6, SCOPE_INTERNAL, ServiceEntry,
    ServiceKey, ServiceKey6, SocketFrontend, SocketFrontend6,
};

use crate::{
    context::SockAddr,
    family::{self, Family as _},
    log,
    maps::{
        REVERSE, REVERSE6, ReverseMap, SERVICES, SERVICES6, SOCKETS, SOCKETS6, ServiceMap,
        SocketRing,
    },
    trace::Traced,
};

/// An address as the maps hold it (network order). Compared and copied word by word: a
/// whole-array compare or volatile copy of 16 bytes may become a wide or unaligned access.
pub trait Address: Copy + Default + Traced {
    fn same(&self, other: &Self) -> bool;

    /// # Safety
    /// `from` must be valid for reads.
    unsafe fn read_volatile(from: *const Self) -> Self;

    /// # Safety
    /// `to` must be valid for writes.
    unsafe fn write_volatile(to: *mut Self, value: Self);
}

impl Address for u32 {
    #[inline(always)]
    fn same(&self, other: &Self) -> bool {
        self == other
    }

    #[inline(always)]
    unsafe fn read_volatile(from: *const Self) -> Self {
        // SAFETY: the caller's pointer.
        unsafe { from.read_volatile() }
    }

    #[inline(always)]
    unsafe fn write_volatile(to: *mut Self, value: Self) {
        // SAFETY: the caller's pointer.
        unsafe { to.write_volatile(value) }
    }
}

impl Address for Ipv6Words {
    #[inline(always)]
    fn same(&self, other: &Self) -> bool {
        self[0] == other[0] && self[1] == other[1] && self[2] == other[2] && self[3] == other[3]
    }

    #[inline(always)]
    unsafe fn read_volatile(from: *const Self) -> Self {
        let word = from.cast::<u32>();
        // SAFETY: the caller's pointer; the words stay inside the array.
        unsafe {
            [
                word.read_volatile(),
                word.add(1).read_volatile(),
                word.add(2).read_volatile(),
                word.add(3).read_volatile(),
            ]
        }
    }

    #[inline(always)]
    unsafe fn write_volatile(to: *mut Self, value: Self) {
        let word = to.cast::<u32>();
        // SAFETY: as above.
        unsafe {
            word.write_volatile(value[0]);
            word.add(1).write_volatile(value[1]);
            word.add(2).write_volatile(value[2]);
            word.add(3).write_volatile(value[3]);
        }
    }
}

/// A frontend as the reverse maps record it: what the socket asked for.
#[derive(Clone, Copy)]
pub struct Frontend<A> {
    pub address: A,
    pub port: u16,
    pub service_id: u32,
}

impl<A: Address> Frontend<A> {
    #[inline(always)]
    pub fn same(&self, other: &Self) -> bool {
        self.address.same(&other.address)
            && self.port == other.port
            && self.service_id == other.service_id
    }
}

/// The master entry's fields.
pub struct Master {
    pub count: u16,
    pub flags: u16,
    pub service_id: u32,
    pub affinity_timeout_s: u32,
    pub first_slot: u32,
}

/// A backend slot's fields.
#[derive(Clone, Copy)]
pub struct Slot<A> {
    pub backend_id: u32,
    pub address: A,
    pub port: u16,
}

/// Pointers to the fields of a socket ring entry, for `socket`'s ordered writes and reads.
pub struct RingFields<A> {
    pub cookie: *mut u64,
    pub backend_address: *mut A,
    pub backend_port: *mut u16,
    pub frontend_address: *mut A,
    pub frontend_port: *mut u16,
    pub service_id: *mut u32,
}

pub trait Family {
    type Address: Address;
    type ServiceKey: 'static;
    type ServiceEntry: Copy + 'static;
    type ReverseKey: 'static;
    type ReverseEntry: Copy + 'static;
    type SocketFrontend: 'static;

    fn services() -> &'static ServiceMap<Self::ServiceKey, Self::ServiceEntry>;
    fn reverse() -> &'static ReverseMap<Self::ReverseKey, Self::ReverseEntry>;
    fn sockets() -> &'static SocketRing<Self::SocketFrontend>;

    /// The socket's destination (or peer) address.
    fn destination(sock: &SockAddr) -> Self::Address;
    fn set_destination(sock: &SockAddr, address: Self::Address, port: u16);

    /// The internal-scope key of a frontend's master entry.
    fn service_key(address: Self::Address, port: u16, protocol: u8) -> Self::ServiceKey;
    fn master(entry: &Self::ServiceEntry) -> Master;
    /// The backend holding `id`; `None` if no backend of this family holds it.
    fn backend(id: u32) -> Option<Slot<Self::Address>>;

    fn reverse_key(cookie: u64, backend: Self::Address, port: u16) -> Self::ReverseKey;
    fn reverse_entry(frontend: &Frontend<Self::Address>) -> Self::ReverseEntry;
    fn frontend(entry: &Self::ReverseEntry) -> Frontend<Self::Address>;

    /// # Safety
    /// `entry` must point into the socket ring.
    unsafe fn ring_fields(entry: *mut Self::SocketFrontend) -> RingFields<Self::Address>;

    /// `SocketRecord::family` of this family's sockets.
    const RECORD_FAMILY: u8;
    /// An address as a socket record holds it (IPv4 in the last word).
    fn words(address: Self::Address) -> Ipv6Words;

    fn log_missing_slots(address: Self::Address, port: u16, count: u16);
}

/// The methods whose bodies are the same for both families: the ABI gives the IPv4 and
/// IPv6 entries the same field names, only the address type differs.
macro_rules! same_fields {
    ($key:ident, $entry:ident, $reverse_entry:ident, $socket:ident, $packets:ty) => {
        /// The backend map is the per-packet path's family's.
        #[inline(always)]
        fn backend(id: u32) -> Option<Slot<Self::Address>> {
            let backend = <$packets>::backend_entry(id)?;
            Some(Slot {
                backend_id: id,
                address: backend.address,
                port: backend.port,
            })
        }

        #[inline(always)]
        fn service_key(address: Self::Address, port: u16, protocol: u8) -> $key {
            $key {
                address,
                port,
                protocol,
                scope: SCOPE_INTERNAL,
                slot: 0,
                pad: 0,
            }
        }

        #[inline(always)]
        fn master(entry: &$entry) -> Master {
            Master {
                count: entry.count,
                flags: entry.flags,
                service_id: entry.service_id,
                affinity_timeout_s: entry.affinity_timeout_s,
                first_slot: entry.first_slot,
            }
        }

        #[inline(always)]
        fn reverse_entry(frontend: &Frontend<Self::Address>) -> $reverse_entry {
            $reverse_entry {
                address: frontend.address,
                port: frontend.port,
                pad: 0,
                service_id: frontend.service_id,
            }
        }

        #[inline(always)]
        fn frontend(entry: &$reverse_entry) -> Frontend<Self::Address> {
            Frontend {
                address: entry.address,
                port: entry.port,
                service_id: entry.service_id,
            }
        }

        #[inline(always)]
        unsafe fn ring_fields(entry: *mut $socket) -> RingFields<Self::Address> {
            use core::ptr::addr_of_mut;
            // SAFETY: the caller's pointer; field pointers stay inside the entry.
            unsafe {
                RingFields {
                    cookie: addr_of_mut!((*entry).cookie),
                    backend_address: addr_of_mut!((*entry).backend_address),
                    backend_port: addr_of_mut!((*entry).backend_port),
                    frontend_address: addr_of_mut!((*entry).frontend_address),
                    frontend_port: addr_of_mut!((*entry).frontend_port),
                    service_id: addr_of_mut!((*entry).service_id),
                }
            }
        }
    };
}

/// IPv4 sockets, and IPv6 sockets talking to IPv4-mapped addresses.
pub struct V4;

/// IPv6 sockets talking to native IPv6 addresses.
pub struct V6;

impl Family for V4 {
    type Address = u32;
    type ServiceKey = ServiceKey;
    type ServiceEntry = ServiceEntry;
    type ReverseKey = ReverseKey;
    type ReverseEntry = ReverseEntry;
    type SocketFrontend = SocketFrontend;

    const RECORD_FAMILY: u8 = 4;

    same_fields!(
        ServiceKey,
        ServiceEntry,
        ReverseEntry,
        SocketFrontend,
        family::V4
    );

    #[inline(always)]
    fn words(address: u32) -> Ipv6Words {
        [0, 0, 0, address]
    }

    #[inline(always)]
    fn services() -> &'static ServiceMap<ServiceKey, ServiceEntry> {
        &SERVICES
    }

    #[inline(always)]
    fn reverse() -> &'static ReverseMap<ReverseKey, ReverseEntry> {
        &REVERSE
    }

    #[inline(always)]
    fn sockets() -> &'static SocketRing<SocketFrontend> {
        &SOCKETS
    }

    #[inline(always)]
    fn destination(sock: &SockAddr) -> u32 {
        sock.address()
    }

    #[inline(always)]
    fn set_destination(sock: &SockAddr, address: u32, port: u16) {
        sock.set_destination(address, port);
    }

    #[inline(always)]
    fn reverse_key(cookie: u64, backend: u32, port: u16) -> ReverseKey {
        ReverseKey {
            cookie,
            address: backend,
            port,
            pad: 0,
            pad2: [],
        }
    }

    #[inline(always)]
    fn log_missing_slots(address: u32, port: u16, count: u16) {
        log::missing_slots(u32::from_be(address), u16::from_be(port), count);
    }
}

impl Family for V6 {
    type Address = Ipv6Words;
    type ServiceKey = ServiceKey6;
    type ServiceEntry = ServiceEntry;
    type ReverseKey = ReverseKey6;
    type ReverseEntry = ReverseEntry6;
    type SocketFrontend = SocketFrontend6;

    const RECORD_FAMILY: u8 = 6;

    same_fields!(
        ServiceKey6,
        ServiceEntry,
        ReverseEntry6,
        SocketFrontend6,
        family::V6
    );

    #[inline(always)]
    fn words(address: Ipv6Words) -> Ipv6Words {
        address
    }

    #[inline(always)]
    fn services() -> &'static ServiceMap<ServiceKey6, ServiceEntry> {
        &SERVICES6
    }

    #[inline(always)]
    fn reverse() -> &'static ReverseMap<ReverseKey6, ReverseEntry6> {
        &REVERSE6
    }

    #[inline(always)]
    fn sockets() -> &'static SocketRing<SocketFrontend6> {
        &SOCKETS6
    }

    #[inline(always)]
    fn destination(sock: &SockAddr) -> Ipv6Words {
        sock.address6()
    }

    #[inline(always)]
    fn set_destination(sock: &SockAddr, address: Ipv6Words, port: u16) {
        sock.set_destination6(address, port);
    }

    #[inline(always)]
    fn reverse_key(cookie: u64, backend: Ipv6Words, port: u16) -> ReverseKey6 {
        ReverseKey6 {
            cookie,
            address: backend,
            port,
            pad: 0,
            pad2: 0,
        }
    }

    #[inline(always)]
    fn log_missing_slots(_address: Ipv6Words, port: u16, count: u16) {
        log::missing_slots6(u16::from_be(port), count);
    }
}
