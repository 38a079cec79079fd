//! The agent's two BPF programs, as instructions it loads itself with the `bpf(2)` system
//! call: no compiler, no object file, no BPF library.
//!
//! **The XDP program of the AF_XDP underlay** ([`program`]).
//! The program redirects a frame to the AF_XDP socket of its receive queue (an XSKMAP)
//! when it is a whole UDP datagram to the tunnel port: IPv4 without options and not a
//! fragment, or IPv6 whose next header is UDP. Everything else (ARP, neighbour discovery,
//! SSH, the libp2p TCP port, other UDP, fragments) passes to the kernel, and so does a
//! tunnel datagram on a queue without a socket (`bpf_redirect_map`'s flags give the
//! action for a missing entry, Linux 5.3). The frames it passes over are exactly those
//! `hyphae_vswitch::udp::parse` accepts.
//!
//! **The TAP steering program** ([`steering_program`]): which queue of a multi-queue TAP
//! the kernel hands a frame to (`TUNSETSTEERINGEBPF`), so that a flow is read by the
//! worker that owns its tunnel shard, from its first frame and for good.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;

const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_SOCKET_FILTER: u32 = 1;
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
// The packet loads of socket programs (through the context in r6; a load past the end
// ends the program with 0), 64-bit arithmetic and the stack.
const LD_ABS_W: u8 = 0x20;
const LD_ABS_H: u8 = 0x28;
const LD_ABS_B: u8 = 0x30;
const LD_IND_H: u8 = 0x48;
const LSH64_K: u8 = 0x67;
const RSH64_K: u8 = 0x77;
const OR64_X: u8 = 0x4f;
const XOR64_X: u8 = 0xaf;
const MUL64_X: u8 = 0x2f;
const MOD64_K: u8 = 0x97;
const JLT_X: u8 = 0xad;
const ST_DW: u8 = 0x7a;
const STX_DW: u8 = 0x7b;
const LDX_DW: u8 = 0x79;

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

/// Appends a jump to instruction `target` of `p` (a label: an index the program checks as
/// it is laid out); the offset counts from the next instruction.
fn jump(p: &mut Vec<u64>, code: u8, dst: u8, src: u8, target: usize, imm: i32) {
    let off = target as i16 - p.len() as i16 - 1;
    p.push(insn(code, dst, src, off, imm));
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

/// The TAP steering program for `shards` shards: an IPv4 or IPv6 frame goes to queue
/// `hyphae_overlay::flow_shard(packet, shards)`, the shard its flow is sealed on, which
/// worker `k` (reading queue `k`, receiving shard `k`'s datagrams) owns; anything else to
/// queue 0. (A tunnel has at most `MAX_SHARDS` shards: with more workers than that, the
/// caller passes that bound, and the workers above it read no member's flow.) The same hash of addresses, protocol and ports (TCP and UDP, not a fragment;
/// splitmix64's finalizer), in 64-bit BPF arithmetic; an IPv6 address folded to 32 bits
/// (its words XORed), the next header for the protocol, ports when TCP or UDP follows the
/// fixed header. One difference, for malformed frames only: a TCP or UDP packet cut before
/// its ports goes to queue 0 here (the load fails) where the hash takes its ports as 0.
pub(crate) fn steering_program(shards: u32) -> Vec<u64> {
    // Registers: r6 the context (packet loads read through it), r7 protocol, r8 and r9
    // the IHL, then the addresses; the ports on the stack until every load is done (a
    // load clobbers r1-r5).
    const PORTS: usize = 17;
    const ADDRESSES: usize = 21;
    const IPV6: usize = 26;
    const PORTS6: usize = 48;
    const JOIN: usize = 52;
    const SWAP: usize = 57;
    const KEY: usize = 63;
    const ZERO: usize = 88;
    let mut p: Vec<u64> = Vec::with_capacity(ZERO + 2);
    let imm64 = |p: &mut Vec<u64>, dst: u8, v: u64| {
        p.push(insn(LD_IMM64, dst, 0, 0, v as u32 as i32));
        p.push(insn(0, 0, 0, 0, (v >> 32) as u32 as i32));
    };
    p.push(insn(MOV64_X, 6, 1, 0, 0));
    p.push(insn(LD_ABS_H, 0, 0, 0, 12)); // EtherType (host order)
    jump(&mut p, JEQ_K, 0, 0, IPV6, 0x86dd);
    jump(&mut p, JNE_K, 0, 0, ZERO, 0x0800);
    p.push(insn(LD_ABS_B, 0, 0, 0, 14)); // version and IHL
    p.push(insn(AND64_K, 0, 0, 0, 0x0f));
    p.push(insn(LSH64_K, 0, 0, 0, 2));
    p.push(insn(MOV64_X, 9, 0, 0, 0));
    p.push(insn(LD_ABS_B, 0, 0, 0, 23)); // protocol
    p.push(insn(MOV64_X, 7, 0, 0, 0));
    p.push(insn(ST_DW, 10, 0, -8, 0)); // source port
    p.push(insn(ST_DW, 10, 0, -16, 0)); // destination port
    p.push(insn(LD_ABS_H, 0, 0, 0, 20)); // flags and fragment offset
    p.push(insn(AND64_K, 0, 0, 0, 0x3fff));
    jump(&mut p, JNE_K, 0, 0, ADDRESSES, 0);
    jump(&mut p, JEQ_K, 7, 0, PORTS, 6);
    jump(&mut p, JNE_K, 7, 0, ADDRESSES, 17);
    debug_assert_eq!(p.len(), PORTS);
    p.push(insn(LD_IND_H, 0, 9, 0, 14));
    p.push(insn(STX_DW, 10, 0, -8, 0));
    p.push(insn(LD_IND_H, 0, 9, 0, 16));
    p.push(insn(STX_DW, 10, 0, -16, 0));
    debug_assert_eq!(p.len(), ADDRESSES);
    p.push(insn(LD_ABS_W, 0, 0, 0, 26));
    p.push(insn(MOV64_X, 8, 0, 0, 0));
    p.push(insn(LD_ABS_W, 0, 0, 0, 30));
    p.push(insn(MOV64_X, 9, 0, 0, 0));
    jump(&mut p, JA, 0, 0, JOIN, 0);
    // IPv6: each address's four words XORed (r8 the source, r9 the destination), the next
    // header, and the ports behind the fixed header when it is TCP or UDP.
    debug_assert_eq!(p.len(), IPV6);
    for (register, at) in [(8u8, 22i32), (9, 38)] {
        p.push(insn(LD_ABS_W, 0, 0, 0, at));
        p.push(insn(MOV64_X, register, 0, 0, 0));
        for word in 1..4 {
            p.push(insn(LD_ABS_W, 0, 0, 0, at + 4 * word));
            p.push(insn(XOR64_X, register, 0, 0, 0));
        }
    }
    p.push(insn(LD_ABS_B, 0, 0, 0, 20)); // next header
    p.push(insn(MOV64_X, 7, 0, 0, 0));
    p.push(insn(ST_DW, 10, 0, -8, 0));
    p.push(insn(ST_DW, 10, 0, -16, 0));
    jump(&mut p, JEQ_K, 7, 0, PORTS6, 6);
    jump(&mut p, JNE_K, 7, 0, JOIN, 17);
    debug_assert_eq!(p.len(), PORTS6);
    p.push(insn(LD_ABS_H, 0, 0, 0, 54));
    p.push(insn(STX_DW, 10, 0, -8, 0));
    p.push(insn(LD_ABS_H, 0, 0, 0, 56));
    p.push(insn(STX_DW, 10, 0, -16, 0));
    debug_assert_eq!(p.len(), JOIN);
    p.push(insn(LDX_DW, 1, 10, -8, 0));
    p.push(insn(LDX_DW, 2, 10, -16, 0));
    // (r8, r1) is the source end, (r9, r2) the destination: the lower one first.
    jump(&mut p, JLT_X, 8, 9, KEY, 0);
    jump(&mut p, JGT_X, 8, 9, SWAP, 0);
    jump(&mut p, JLE_X, 1, 2, KEY, 0);
    debug_assert_eq!(p.len(), SWAP);
    p.push(insn(MOV64_X, 3, 8, 0, 0));
    p.push(insn(MOV64_X, 8, 9, 0, 0));
    p.push(insn(MOV64_X, 9, 3, 0, 0));
    p.push(insn(MOV64_X, 3, 1, 0, 0));
    p.push(insn(MOV64_X, 1, 2, 0, 0));
    p.push(insn(MOV64_X, 2, 3, 0, 0));
    debug_assert_eq!(p.len(), KEY);
    // (lo address << 32 | hi address) ^ (lo port << 48 | hi port << 32 | protocol)
    p.push(insn(MOV64_X, 0, 8, 0, 0));
    p.push(insn(LSH64_K, 0, 0, 0, 32));
    p.push(insn(OR64_X, 0, 9, 0, 0));
    p.push(insn(LSH64_K, 1, 0, 0, 48));
    p.push(insn(LSH64_K, 2, 0, 0, 32));
    p.push(insn(OR64_X, 1, 2, 0, 0));
    p.push(insn(OR64_X, 1, 7, 0, 0));
    p.push(insn(XOR64_X, 0, 1, 0, 0));
    for (shift, factor) in [(30, 0xbf58_476d_1ce4_e5b9), (27, 0x94d0_49bb_1331_11eb)] {
        p.push(insn(MOV64_X, 1, 0, 0, 0));
        p.push(insn(RSH64_K, 1, 0, 0, shift));
        p.push(insn(XOR64_X, 0, 1, 0, 0));
        imm64(&mut p, 1, factor);
        p.push(insn(MUL64_X, 0, 1, 0, 0));
    }
    p.push(insn(MOV64_X, 1, 0, 0, 0));
    p.push(insn(RSH64_K, 1, 0, 0, 31));
    p.push(insn(XOR64_X, 0, 1, 0, 0));
    p.push(insn(MOD64_K, 0, 0, 0, shards.max(1) as i32));
    p.push(insn(EXIT, 0, 0, 0, 0));
    debug_assert_eq!(p.len(), ZERO);
    p.push(insn(MOV64_K, 0, 0, 0, 0));
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
    load_program(BPF_PROG_TYPE_XDP, b"hyphae_xsk", &insns)
}

/// Loads the TAP steering program for `shards` shards.
pub(crate) fn load_steering(shards: u32) -> io::Result<OwnedFd> {
    load_program(
        BPF_PROG_TYPE_SOCKET_FILTER,
        b"hyphae_steer",
        &steering_program(shards),
    )
}

fn load_program(prog_type: u32, label: &[u8], insns: &[u64]) -> io::Result<OwnedFd> {
    let license = c"Apache-2.0 OR GPL-2.0";
    let mut name = [0u8; 16];
    let n = label.len().min(15);
    name[..n].copy_from_slice(&label[..n]);
    let mut attr = ProgLoad {
        prog_type,
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

/// Runs `prog` (a socket program) once over `frame` (`BPF_PROG_TEST_RUN`) and returns
/// what it returned. The kernel takes the first 14 bytes of the input as an Ethernet header
/// and runs the program behind it, so `frame` goes in behind one more.
#[cfg(test)]
fn test_run(prog: &OwnedFd, frame: &[u8]) -> io::Result<u32> {
    const BPF_PROG_TEST_RUN: libc::c_long = 10;
    #[repr(C)]
    struct TestRun {
        prog_fd: u32,
        retval: u32,
        data_size_in: u32,
        data_size_out: u32,
        data_in: u64,
        data_out: u64,
        repeat: u32,
        duration: u32,
    }
    let mut data = vec![0u8; 14];
    data[..6].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    data[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    data[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    data.extend_from_slice(frame);
    let mut attr = TestRun {
        prog_fd: prog.as_raw_fd() as u32,
        retval: 0,
        data_size_in: data.len() as u32,
        data_size_out: 0,
        data_in: data.as_ptr() as u64,
        data_out: 0,
        repeat: 1,
        duration: 0,
    };
    bpf(BPF_PROG_TEST_RUN, &mut attr)?;
    Ok(attr.retval)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's verdict on the steering program for every frame of a varied set
    /// (TCP, UDP, ICMP, fragments, IP options, equal addresses, runts, ARP) is the
    /// shard the tunnel seals the flow on. Loads a BPF program: run as root.
    #[test]
    fn the_steering_program_picks_the_flows_shard() {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "this test loads a BPF program: run it as root"
        );
        let mut seed = 0x1234_5678_9abc_def0u64;
        let mut next = move || {
            seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = seed;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z ^ (z >> 27)
        };
        for queues in [2u32, 3, 4, 8] {
            let prog = load_steering(queues).expect("the kernel loads the steering program");
            let mut seen = vec![0u32; queues as usize];
            for i in 0..600u32 {
                let r = next();
                let options = if i % 7 == 0 { 4 } else { 0 };
                let protocol = [6u8, 17, 1, 6, 17][(i % 5) as usize];
                let mut ip = vec![0u8; 20 + options + 8];
                ip[0] = 0x45 + (options / 4) as u8;
                ip[9] = protocol;
                if i % 11 == 0 {
                    ip[6] = 0x20; // more fragments
                }
                let (src, dst) = if i % 13 == 0 {
                    (r as u32, r as u32)
                } else {
                    (r as u32, (r >> 32) as u32)
                };
                ip[12..16].copy_from_slice(&src.to_be_bytes());
                ip[16..20].copy_from_slice(&dst.to_be_bytes());
                let ports = next();
                ip[20 + options..24 + options].copy_from_slice(&(ports as u32).to_be_bytes());
                let mut frame = vec![0u8; 12];
                frame.extend_from_slice(&0x0800u16.to_be_bytes());
                frame.extend_from_slice(&ip);
                let want = hyphae_overlay::flow_shard(&ip, queues as usize) as u32;
                let got = test_run(&prog, &frame).expect("test run");
                assert_eq!(got, want, "frame {i} ({queues} queues): {ip:02x?}");
                seen[got as usize] += 1;
            }
            assert!(seen.iter().all(|&n| n > 0), "every queue used: {seen:?}");
            // IPv6: TCP, UDP, ICMPv6; equal addresses now and then.
            let mut seen = vec![0u32; queues as usize];
            for i in 0..600u32 {
                let mut ip = vec![0u8; 40 + 8];
                ip[0] = 0x60;
                ip[4..6].copy_from_slice(&8u16.to_be_bytes());
                ip[6] = [6u8, 17, 58, 6, 17][(i % 5) as usize];
                ip[7] = 64;
                for chunk in ip[8..40].chunks_exact_mut(8) {
                    chunk.copy_from_slice(&next().to_be_bytes());
                }
                if i % 13 == 0 {
                    let src: [u8; 16] = ip[8..24].try_into().unwrap();
                    ip[24..40].copy_from_slice(&src);
                }
                ip[40..44].copy_from_slice(&(next() as u32).to_be_bytes());
                let mut frame = vec![0u8; 12];
                frame.extend_from_slice(&0x86ddu16.to_be_bytes());
                frame.extend_from_slice(&ip);
                let want = hyphae_overlay::flow_shard(&ip, queues as usize) as u32;
                let got = test_run(&prog, &frame).expect("test run");
                assert_eq!(got, want, "IPv6 frame {i} ({queues} queues): {ip:02x?}");
                seen[got as usize] += 1;
            }
            assert!(
                seen.iter().all(|&n| n > 0),
                "every queue used by IPv6: {seen:?}"
            );
            // Runts and other EtherTypes: queue 0.
            let mut arp = vec![0u8; 12];
            arp.extend_from_slice(&0x0806u16.to_be_bytes());
            arp.extend_from_slice(&[0u8; 28]);
            assert_eq!(test_run(&prog, &arp).expect("test run"), 0);
            let mut runt = vec![0u8; 12];
            runt.extend_from_slice(&0x0800u16.to_be_bytes());
            runt.extend_from_slice(&[0x45, 0, 0, 20, 0, 0, 0, 0, 64, 6]);
            assert_eq!(test_run(&prog, &runt).expect("test run"), 0);
        }
    }

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
