//! The socket iterators that close sockets translated to a backend that left (socklb-ebpf
//! `destroy`), loaded next to the other programs when the kernel allows it.
//!
//! [`patch_kfunc_call`] writes the `bpf_sock_destroy` kfunc's id into their raw call.
//! Whatever fails here only costs this mode: the agent falls back to netlink and says why
//! (docs/operations.md, "Sockets of removed backends", Modes).
use std::{
    borrow::Cow,
    os::fd::{AsFd as _, OwnedFd},
};

use aya::{
    Btf, Ebpf,
    maps::{HashMap, MapData},
    programs::Iter,
};
use aya_obj::btf::BtfKind;
use socklb_abi::{GoneKey, GoneKey6, SOCK_DESTROY_CALL, map_names, program_names};

/// The kernel function the iterators call.
const KFUNC: &str = "bpf_sock_destroy";

/// The loaded iterators (their programs' fds, which keep them alive) and the gone map.
pub struct DestroyPrograms {
    pub udp: OwnedFd,
    pub tcp: OwnedFd,
    pub gone: HashMap<MapData, GoneKey, u8>,
    pub gone6: HashMap<MapData, GoneKey6, u8>,
}

/// Why the iterators are not available; said once, at start.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    #[error("the kernel has no BTF at /sys/kernel/btf/vmlinux")]
    NoBtf(#[source] aya::BtfError),
    #[error("the kernel has no {KFUNC} kfunc (Linux >= 6.5)")]
    NoKfunc,
    #[error("the object has no placeholder call to patch: the build is broken")]
    NoPlaceholder,
    #[error("the embedded eBPF object has no {0}: the build is broken")]
    Missing(&'static str),
    #[error(
        "the kernel refused the socket iterator {name} (a tracing program: loading it needs \
         CAP_PERFMON besides CAP_BPF; add PERFMON to the Helm value `capabilities`)"
    )]
    Load {
        name: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("cannot use map {}", map_names::GONE)]
    Map(#[source] aya::maps::MapError),
    #[error("cannot duplicate a program fd")]
    Fd(#[source] std::io::Error),
}

/// Whether this kernel has the kfunc the socket iterators call (for `socklb inspect`).
pub fn probe_kfunc() -> Result<(), Unavailable> {
    kfunc_id().map(|_| ())
}

/// The kernel's BTF and the kfunc's id in it, if it has one.
pub fn kfunc_id() -> Result<(Btf, u32), Unavailable> {
    let btf = Btf::from_sys_fs().map_err(Unavailable::NoBtf)?;
    let id = btf
        .id_by_type_name_kind(KFUNC, BtfKind::Func)
        .map_err(|_| Unavailable::NoKfunc)?;
    Ok((btf, id))
}

/// The byte offset of `skc_cookie` in the running kernel's `struct sock_common`, read from
/// its BTF; 0 if it cannot be found (the programs then use the helper).
pub fn skc_cookie_offset() -> u32 {
    sock_common_offset("skc_cookie")
}

/// The byte offset of `skc_v6_daddr` in `struct sock_common`; 0 if it cannot be found (the
/// programs then leave IPv6 sockets alone).
pub fn skc_v6_daddr_offset() -> u32 {
    sock_common_offset("skc_v6_daddr")
}

fn sock_common_offset(member: &str) -> u32 {
    std::fs::read("/sys/kernel/btf/vmlinux")
        .ok()
        .and_then(|btf| member_offset(&btf, "sock_common", member))
        .unwrap_or(0)
}

/// The byte offset of the direct member `member` of the struct `name` in raw BTF (the
/// format of /sys/kernel/btf/vmlinux: a header, then the types, then the strings).
/// Parsed here because aya-obj 0.6 keeps its type lookup (`type_by_id`) and struct members
/// crate-private: its public API finds a type's id by name, not a member's offset.
fn member_offset(btf: &[u8], name: &str, member: &str) -> Option<u32> {
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(btf.get(at..at + 4)?.try_into().ok()?))
    };
    if btf.get(0..2)? != [0x9f, 0xeb] {
        return None;
    }
    let header_len = u32_at(4)? as usize;
    let (type_off, type_len) = (u32_at(8)? as usize, u32_at(12)? as usize);
    let string_off = u32_at(16)? as usize;
    let strings = header_len + string_off;
    let string = |offset: u32| -> Option<&[u8]> {
        let start = strings + offset as usize;
        let rest = btf.get(start..)?;
        Some(&rest[..rest.iter().position(|b| *b == 0)?])
    };
    let mut at = header_len + type_off;
    let end = at + type_len;
    while at + 12 <= end {
        let (name_off, info) = (u32_at(at)?, u32_at(at + 4)?);
        let vlen = (info & 0xffff) as usize;
        let kind = (info >> 24) & 0x1f;
        let kind_flag = info >> 31 == 1;
        at += 12;
        // Bytes after the common header, per kind (uapi/linux/btf.h).
        let extra = match kind {
            1 | 14 | 17 => 4,
            3 => 12,
            4 | 5 | 15 | 19 => 12 * vlen,
            6 | 13 => 8 * vlen,
            _ => 0,
        };
        // A struct named `name`: its members are (name, type, offset in bits).
        if kind == 4 && string(name_off)? == name.as_bytes() {
            for i in 0..vlen {
                let entry = at + 12 * i;
                if string(u32_at(entry)?)? == member.as_bytes() {
                    let offset = u32_at(entry + 8)?;
                    // With kind_flag the low 24 bits are the offset (the high 8 a
                    // bitfield's size).
                    let bits = if kind_flag {
                        offset & 0xff_ffff
                    } else {
                        offset
                    };
                    return bits.is_multiple_of(8).then_some(bits / 8);
                }
            }
            return None;
        }
        at += extra;
    }
    None
}

/// The object with every placeholder kfunc call aimed at `id`; `object` itself when `id`
/// is `None` (the iterators then fail to load, and nothing else calls the kfunc).
pub fn patch_kfunc_call(object: &[u8], id: Option<u32>) -> Result<Cow<'_, [u8]>, Unavailable> {
    let Some(id) = id else {
        return Ok(Cow::Borrowed(object));
    };
    let placeholder = SOCK_DESTROY_CALL.to_le_bytes();
    let call = ((u64::from(id) << 32) | (SOCK_DESTROY_CALL & 0xffff_ffff)).to_le_bytes();
    let mut patched = object.to_vec();
    let mut found = 0;
    // Instructions are 8-byte aligned in the ELF, as is the file's start.
    for chunk in patched.as_chunks_mut::<8>().0 {
        if *chunk == placeholder {
            chunk.copy_from_slice(&call);
            found += 1;
        }
    }
    if found == 0 {
        return Err(Unavailable::NoPlaceholder);
    }
    Ok(Cow::Owned(patched))
}

/// Loads both iterators of `ebpf` (an object patched by [`patch_kfunc_call`]).
pub fn load(ebpf: &mut Ebpf, btf: &Btf) -> Result<DestroyPrograms, Unavailable> {
    let mut fds = Vec::with_capacity(2);
    for (name, iter_type) in [
        (program_names::DESTROY_UDP, "udp"),
        (program_names::DESTROY_TCP, "tcp"),
    ] {
        let program: &mut Iter = ebpf
            .program_mut(name)
            .ok_or(Unavailable::Missing(name))?
            .try_into()
            .map_err(|source| Unavailable::Load { name, source })?;
        program
            .load(iter_type, btf)
            .map_err(|source| Unavailable::Load { name, source })?;
        let fd = program
            .fd()
            .map_err(|source| Unavailable::Load { name, source })?
            .as_fd()
            .try_clone_to_owned()
            .map_err(Unavailable::Fd)?;
        fds.push(fd);
    }
    let gone = ebpf
        .take_map(map_names::GONE)
        .ok_or(Unavailable::Missing(map_names::GONE))?
        .try_into()
        .map_err(Unavailable::Map)?;
    let gone6 = ebpf
        .take_map(map_names::GONE6)
        .ok_or(Unavailable::Missing(map_names::GONE6))?
        .try_into()
        .map_err(Unavailable::Map)?;
    let (Some(tcp), Some(udp)) = (fds.pop(), fds.pop()) else {
        return Err(Unavailable::Missing(program_names::DESTROY_UDP));
    };
    Ok(DestroyPrograms {
        udp,
        tcp,
        gone,
        gone6,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_placeholder_call_is_aimed_at_the_kfunc() {
        let mut object = vec![0u8; 8];
        object.extend(SOCK_DESTROY_CALL.to_le_bytes());
        object.extend([0x85, 0, 0, 0, 1, 0, 0, 0]);
        let patched = patch_kfunc_call(&object, Some(65_750)).expect("patched");
        assert_eq!(&patched[..8], &[0; 8]);
        let call = u64::from_le_bytes(patched[8..16].try_into().expect("8 bytes"));
        assert_eq!(call & 0xff, 0x85, "still a call");
        assert_eq!((call >> 12) & 0xf, 2, "to a kfunc");
        assert_eq!(call >> 32, 65_750);
        assert_eq!(
            &patched[16..],
            &object[16..],
            "other instructions untouched"
        );
        assert_ne!(socklb_abi::SOCK_DESTROY_PLACEHOLDER, 65_750);
    }

    /// Raw BTF: an int, then `struct sock_common { int a; int b; long skc_cookie; }` with
    /// skc_cookie at byte 8.
    fn btf() -> Vec<u8> {
        let strings = b"\0int\0sock_common\0a\0b\0skc_cookie\0".to_vec();
        let mut types = Vec::new();
        let mut put = |words: &[u32]| {
            for word in words {
                types.extend(word.to_le_bytes());
            }
        };
        // [1] INT "int" size 4, encoding word.
        put(&[1, 1 << 24, 4, 32]);
        // [2] STRUCT "sock_common", 3 members, size 16.
        put(&[5, (4 << 24) | 3, 16]);
        put(&[17, 1, 0]);
        put(&[19, 1, 32]);
        put(&[21, 1, 64]);
        let mut btf = vec![0x9f, 0xeb, 1, 0];
        for word in [
            24,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            btf.extend(word.to_le_bytes());
        }
        btf.extend(types);
        btf.extend(strings);
        btf
    }

    #[test]
    fn the_cookie_offset_comes_from_the_btf() {
        let btf = btf();
        assert_eq!(member_offset(&btf, "sock_common", "skc_cookie"), Some(8));
        assert_eq!(member_offset(&btf, "sock_common", "b"), Some(4));
        assert_eq!(member_offset(&btf, "sock_common", "skc_daddr"), None);
        assert_eq!(member_offset(&btf, "sock", "skc_cookie"), None);
        assert_eq!(member_offset(&btf[..20], "sock_common", "skc_cookie"), None);
    }

    #[test]
    fn an_object_without_the_call_is_refused() {
        assert!(matches!(
            patch_kfunc_call(&[0; 16], Some(1)),
            Err(Unavailable::NoPlaceholder)
        ));
    }
}
