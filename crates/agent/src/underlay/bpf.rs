//! The XDP program of the AF_XDP underlay, as BPF instructions the agent loads itself with
//! the `bpf(2)` system call: no compiler, no object file, no BPF library.
//!
//! The program redirects a frame to the AF_XDP socket of its receive queue (an XSKMAP)
//! when it is a whole UDP datagram to the tunnel port: IPv4 without options and not a
//! fragment, or IPv6 whose next header is UDP. Everything else (ARP, neighbour discovery,
//! SSH, the libp2p TCP port, other UDP, fragments) passes to the kernel, and so does a
//! tunnel datagram on a queue without a socket (`bpf_redirect_map`'s flags give the
//! action for a missing entry, Linux 5.3). The frames it passes over are exactly those
//! `hyphae_vswitch::udp::parse` accepts.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;

const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;

/// `XDP_FLAGS_SKB_MODE`: generic XDP, after the kernel built its socket buffer.
pub(crate) const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
/// `XDP_FLAGS_DRV_MODE`: native XDP, in the driver.
pub(crate) const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

const XDP_PASS: i32 = 2;
const FN_REDIRECT_MAP: i32 = 51;

// Instruction classes and fields (linux/bpf.h, linux/bpf_common.h).
const LDX_W: u8 = 0x61;
const LDX_H: u8 = 0x69;
const LDX_B: u8 = 0x71;
const MOV64_X: u8 = 0xbf;
const MOV64_K: u8 = 0xb7;
const ADD64_K: u8 = 0x07;
const AND64_K: u8 = 0x57;
const JEQ_K: u8 = 0x15;
const JNE_K: u8 = 0x55;
const JGT_X: u8 = 0x2d;
const JA: u8 = 0x05;
const JLE_X: u8 = 0xbd;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
const LD_IMM64: u8 = 0x18;
const PSEUDO_MAP_FD: u8 = 1;

/// One encoded instruction: opcode, registers (dst low nibble, src high), offset, immediate.
fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    // struct bpf_insn as laid out in memory on a little-endian host.
    u64::from_le_bytes({
        let mut b = [0u8; 8];
        b[0] = code;
        b[1] = (dst & 0xf) | (src << 4);
        b[2..4].copy_from_slice(&off.to_le_bytes());
        b[4..8].copy_from_slice(&imm.to_le_bytes());
        b
    })
}

/// A 16-bit network-order field as a load instruction reads it into a register.
fn net16(v: u16) -> i32 {
    i32::from(u16::from_ne_bytes(v.to_be_bytes()))
}

/// The program: redirect UDP to `port` to the XSKMAP `map_fd`, pass the rest. Frames
/// longer than `max_frame` pass too: they would not fit a socket's frame, and the kernel
/// would drop them at the redirect; the UDP socket takes them instead.
pub(crate) fn program(port: u16, map_fd: RawFd, max_frame: u16) -> Vec<u64> {
    // Registers: r1 ctx, r2 data, r3 data_end, r4 bound, r5 field, r6 ctx kept.
    // Labels are instruction indices (checked as the program is laid out); a jump's
    // offset counts from the next instruction.
    const IPV6: usize = 24;
    const REDIRECT: usize = 30;
    const PASS: usize = 36;
    let mut p: Vec<u64> = Vec::with_capacity(PASS + 2);
    let jump = |p: &mut Vec<u64>, code: u8, dst: u8, src: u8, target: usize, imm: i32| {
        let off = target as i16 - p.len() as i16 - 1;
        p.push(insn(code, dst, src, off, imm));
    };
    p.push(insn(MOV64_X, 6, 1, 0, 0));
    p.push(insn(LDX_W, 2, 1, 0, 0)); // xdp_md.data
    p.push(insn(LDX_W, 3, 1, 4, 0)); // xdp_md.data_end
    p.push(insn(MOV64_X, 4, 2, 0, 0));
    p.push(insn(ADD64_K, 4, 0, 0, i32::from(max_frame) + 1));
    jump(&mut p, JLE_X, 4, 3, PASS, 0); // longer than max_frame
    p.push(insn(MOV64_X, 4, 2, 0, 0));
    p.push(insn(ADD64_K, 4, 0, 0, 14)); // Ethernet
    jump(&mut p, JGT_X, 4, 3, PASS, 0);
    p.push(insn(LDX_H, 5, 2, 12, 0)); // EtherType
    jump(&mut p, JEQ_K, 5, 0, IPV6, net16(0x86dd));
    jump(&mut p, JNE_K, 5, 0, PASS, net16(0x0800));
    p.push(insn(ADD64_K, 4, 0, 0, 28)); // IPv4 20 + UDP 8
    jump(&mut p, JGT_X, 4, 3, PASS, 0);
    p.push(insn(LDX_B, 5, 2, 14, 0));
    jump(&mut p, JNE_K, 5, 0, PASS, 0x45); // version 4, no options
    p.push(insn(LDX_B, 5, 2, 23, 0));
    jump(&mut p, JNE_K, 5, 0, PASS, 17); // UDP
    p.push(insn(LDX_H, 5, 2, 20, 0));
    p.push(insn(AND64_K, 5, 0, 0, net16(0x3fff))); // more fragments, fragment offset
    jump(&mut p, JNE_K, 5, 0, PASS, 0);
    p.push(insn(LDX_H, 5, 2, 36, 0)); // UDP destination port
    jump(&mut p, JEQ_K, 5, 0, REDIRECT, net16(port));
    jump(&mut p, JA, 0, 0, PASS, 0);
    debug_assert_eq!(p.len(), IPV6);
    p.push(insn(ADD64_K, 4, 0, 0, 48)); // IPv6 40 + UDP 8
    jump(&mut p, JGT_X, 4, 3, PASS, 0);
    p.push(insn(LDX_B, 5, 2, 20, 0));
    jump(&mut p, JNE_K, 5, 0, PASS, 17); // next header UDP
    p.push(insn(LDX_H, 5, 2, 56, 0));
    jump(&mut p, JNE_K, 5, 0, PASS, net16(port));
    // The socket of this receive queue, or pass if it has none.
    debug_assert_eq!(p.len(), REDIRECT);
    p.push(insn(LDX_W, 2, 6, 16, 0)); // xdp_md.rx_queue_index
    p.push(insn(LD_IMM64, 1, PSEUDO_MAP_FD, 0, map_fd));
    p.push(insn(0, 0, 0, 0, 0));
    p.push(insn(MOV64_K, 3, 0, 0, XDP_PASS));
    p.push(insn(CALL, 0, 0, 0, FN_REDIRECT_MAP));
    p.push(insn(EXIT, 0, 0, 0, 0));
    debug_assert_eq!(p.len(), PASS);
    p.push(insn(MOV64_K, 0, 0, 0, XDP_PASS));
    p.push(insn(EXIT, 0, 0, 0, 0));
    p
}

/// `bpf(2)`: `attr` is the command's prefix of `union bpf_attr`; the kernel zero-fills the
/// rest.
fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<RawFd> {
    // SAFETY: attr points to a live, initialised repr(C) struct of the given size, laid
    // out as the command's part of union bpf_attr.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as RawFd)
}

fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: `fd` was just returned by the kernel and is owned by no one else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// The XSKMAP: receive queue index -> AF_XDP socket.
pub(crate) fn create_xsk_map(queues: u32) -> io::Result<OwnedFd> {
    #[repr(C)]
    struct MapCreate {
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        map_flags: u32,
    }
    let mut attr = MapCreate {
        map_type: BPF_MAP_TYPE_XSKMAP,
        key_size: 4,
        value_size: 4,
        max_entries: queues,
        map_flags: 0,
    };
    bpf(BPF_MAP_CREATE, &mut attr).map(owned)
}

/// Puts socket `xsk` at `queue` in the XSKMAP.
pub(crate) fn set_xsk(map: &OwnedFd, queue: u32, xsk: RawFd) -> io::Result<()> {
    #[repr(C)]
    struct MapElem {
        map_fd: u32,
        _pad: u32,
        key: u64,
        value: u64,
        flags: u64,
    }
    let key = queue;
    let value = xsk as u32;
    let mut attr = MapElem {
        map_fd: map.as_raw_fd() as u32,
        _pad: 0,
        key: &key as *const u32 as u64,
        value: &value as *const u32 as u64,
        flags: 0,
    };
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(|_| ())
}

#[repr(C)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
}

/// Loads the program for `port` and `max_frame` against the XSKMAP `map`; on refusal the error carries
/// the verifier's last line.
pub(crate) fn load(port: u16, max_frame: u16, map: &OwnedFd) -> io::Result<OwnedFd> {
    let insns = program(port, map.as_raw_fd(), max_frame);
    let license = c"Apache-2.0 OR GPL-2.0";
    let mut name = [0u8; 16];
    name[..10].copy_from_slice(b"hyphae_xsk");
    let mut attr = ProgLoad {
        prog_type: BPF_PROG_TYPE_XDP,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 0,
        log_size: 0,
        log_buf: 0,
        kern_version: 0,
        prog_flags: 0,
        prog_name: name,
    };
    match bpf(BPF_PROG_LOAD, &mut attr) {
        Ok(fd) => Ok(owned(fd)),
        Err(e)
            if e.raw_os_error() == Some(libc::EACCES) || e.raw_os_error() == Some(libc::EINVAL) =>
        {
            // Load again with the verifier's log, to say why.
            let mut log = vec![0u8; 64 * 1024];
            attr.log_level = 1;
            attr.log_size = log.len() as u32;
            attr.log_buf = log.as_mut_ptr() as u64;
            let _ = bpf(BPF_PROG_LOAD, &mut attr).map(owned);
            let text = String::from_utf8_lossy(&log);
            let last = text
                .trim_end_matches('\0')
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .to_string();
            Err(io::Error::new(e.kind(), format!("{e}: verifier: {last}")))
        }
        Err(e) => Err(e),
    }
}

/// Attaches `prog` to interface `ifindex` in `mode` (a bpf link, Linux 5.9): detached
/// when the returned descriptor closes, so an agent that dies leaves no program behind.
pub(crate) fn attach(prog: &OwnedFd, ifindex: u32, mode: u32) -> io::Result<OwnedFd> {
    #[repr(C)]
    struct LinkCreate {
        prog_fd: u32,
        target_ifindex: u32,
        attach_type: u32,
        flags: u32,
    }
    let mut attr = LinkCreate {
        prog_fd: prog.as_raw_fd() as u32,
        target_ifindex: ifindex,
        attach_type: BPF_XDP,
        flags: mode,
    };
    bpf(BPF_LINK_CREATE, &mut attr).map(owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jumps_land_inside_the_program_and_the_port_is_in_network_order() {
        let p = program(7400, 3, 1792);
        let exit_at = p.len() as i64 - 2;
        for (i, ins) in p.iter().enumerate() {
            let b = ins.to_le_bytes();
            let off = i64::from(i16::from_le_bytes([b[2], b[3]]));
            if b[0] & 0x07 == 0x05 && b[0] != CALL && b[0] != EXIT {
                let to = i as i64 + 1 + off;
                assert!(to > i as i64 && to <= exit_at, "insn {i} jumps to {to}");
            }
        }
        let ports: Vec<i32> = p
            .iter()
            .filter(|i| i.to_le_bytes()[0] & 0xf7 == JEQ_K & 0xf7)
            .map(|i| i32::from_le_bytes(i.to_le_bytes()[4..8].try_into().unwrap()))
            .collect();
        assert!(ports.contains(&net16(7400)), "{ports:x?}");
        assert_eq!(net16(0x0800).to_ne_bytes()[..2], [0x08, 0x00]);
    }
}
