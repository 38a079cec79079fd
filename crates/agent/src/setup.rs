//! Process setup for `hyphae up` (`driver::up`): privileges, the identity, the sockets and
//! devices the driver owns. Everything here runs once (or once per namespace) and reports
//! problems as one-line errors a person can act on.

use std::io::{self, ErrorKind};
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use hyphae_overlay::{Identity, PeerId};
use tokio::net::UnixListener;
use tun_rs::SyncDevice;

use crate::config::{Address, Address6, Mode, Namespace, Subnet6};

/// Underlay socket buffers: room for a few milliseconds of traffic at 10 Gb/s.
const SOCKET_BUFFER: usize = 4 << 20;

/// The name of the identity key file in the state directory.
pub const IDENTITY_FILE: &str = "identity.key";

/// 32 bytes from the operating system's RNG: the seed of a core's RNG, a new secret.
#[allow(clippy::disallowed_methods)] // the one place the OS's RNG is read
pub fn os_seed() -> Result<[u8; 32]> {
    let mut seed = [0u8; 32];
    getrandom::getrandom(&mut seed).map_err(|e| anyhow::anyhow!("random number generator: {e}"))?;
    Ok(seed)
}

/// `CAP_NET_ADMIN` is what creating TAP devices and setting their addresses needs.
pub(crate) fn require_net_admin() -> Result<()> {
    const CAP_NET_ADMIN: u32 = 12;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    if eff & (1 << CAP_NET_ADMIN) == 0 {
        bail!("hyphae up needs root (CAP_NET_ADMIN) to create TAP devices; run it with sudo");
    }
    Ok(())
}

/// The identity in the state directory, if there is one that reads (`hyphae doctor`: it
/// creates nothing).
pub(crate) fn load_identity(state_dir: &Path) -> Option<hyphae_overlay::PeerId> {
    let text = std::fs::read_to_string(state_dir.join(IDENTITY_FILE)).ok()?;
    Identity::from_text(&text).ok().map(|i| i.peer_id())
}

/// Loads the identity key from the state directory, creating both on first start.
pub fn load_or_create_identity(state_dir: &Path) -> Result<Identity> {
    let path = state_dir.join(IDENTITY_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => Identity::from_text(&text).with_context(|| {
            format!(
                "{} is not a hyphae identity key (move it away to create a new identity)",
                path.display()
            )
        }),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(state_dir)
                .with_context(|| format!("cannot create state_dir {}", state_dir.display()))?;
            let identity = Identity::from_seed(os_seed()?);
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            io::Write::write_all(&mut file, identity.to_text().as_bytes())?;
            tracing::info!(path = %path.display(), id = %identity.peer_id(), "created identity");
            Ok(identity)
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// The listener of `[agent] metrics`.
pub(crate) async fn bind_web(address: SocketAddr) -> Result<tokio::net::TcpListener> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| match e.kind() {
            ErrorKind::AddrInUse => {
                anyhow::anyhow!("[agent] metrics: {address} is already in use; pick another port")
            }
            _ => anyhow::anyhow!("[agent] metrics: cannot listen on {address}: {e}"),
        })?;
    tracing::info!(%address, "serving /metrics and the topology page");
    Ok(listener)
}

/// Each of `[agent] uplinks` is an address of this host: members are told to send there.
pub(crate) fn check_uplinks_local(uplinks: &[(SocketAddr, u64)]) -> Result<()> {
    for (addr, _) in uplinks {
        if let Err(e) = std::net::UdpSocket::bind(SocketAddr::new(addr.ip(), 0)) {
            anyhow::bail!(
                "[agent] uplinks: {} is not an address of this host ({e})",
                addr.ip()
            );
        }
    }
    Ok(())
}

/// The underlay sockets, one per worker, all bound to `listen`. More than one share the
/// port (`SO_REUSEPORT`), and a program on the group ([`steer_by_shard`]) hands a data
/// message of a tunnel's shard `k` to socket `k` (worker `k`); the kernel hands the rest
/// to one of them by a hash of its addresses and ports, so everything else from one member
/// endpoint reaches one worker, in order.
pub(crate) fn bind_underlay(listen: SocketAddr, count: usize) -> Result<Vec<std::net::UdpSocket>> {
    if count > 1 {
        // Any process of the same user could join a shared port, another agent too: a
        // socket of its own first says whether the port is taken (a port that sockets share
        // refuses one that does not ask to share it).
        drop(bind_one_underlay(listen, false)?);
    }
    let sockets = (0..count.max(1))
        .map(|_| bind_one_underlay(listen, count > 1))
        .collect::<Result<Vec<_>>>()?;
    if count > 1 {
        // Without it every shard of a member's tunnel is still opened, by the worker its
        // endpoint hashes to: correct, only not spread.
        if let Err(e) = steer_by_shard(&sockets[0]) {
            tracing::warn!(error = %e, "no shard steering on the underlay sockets: a member's datagrams reach one worker");
        }
    }
    Ok(sockets)
}

/// Attaches a classic BPF program to the reuseport group of `socket` (sockets join it in
/// the order they were bound): a WireGuard data message (kind 4, 32 bytes at least) goes to
/// the socket whose index is its shard (`hyphae_overlay::SHARD_BYTE`/`SHARD_SHIFT`); for
/// anything else the program returns an index no socket has, and the kernel falls back to
/// its hash. The kernel runs it on the UDP payload.
fn steer_by_shard(socket: &std::net::UdpSocket) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    const FALLBACK: u32 = u32::MAX;
    let op = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code: u32, k: u32, jf: u8| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf,
        k,
    };
    let mut program = [
        // A = the payload's length; shorter than a data message: the hash.
        op(libc::BPF_LD | libc::BPF_W | libc::BPF_LEN, 0),
        jump(libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K, 32, 6),
        // A = kind; not data: the hash.
        op(libc::BPF_LD | libc::BPF_B | libc::BPF_ABS, 0),
        jump(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, 4, 4),
        // A = the shard.
        op(
            libc::BPF_LD | libc::BPF_B | libc::BPF_ABS,
            hyphae_overlay::SHARD_BYTE,
        ),
        op(
            libc::BPF_ALU | libc::BPF_RSH | libc::BPF_K,
            hyphae_overlay::SHARD_SHIFT,
        ),
        op(libc::BPF_ALU | libc::BPF_AND | libc::BPF_K, 7),
        op(libc::BPF_RET | libc::BPF_A, 0),
        op(libc::BPF_RET | libc::BPF_K, FALLBACK),
    ];
    // Each failed test (at 1 and 3) skips to the last instruction (jumps count from the
    // next one).
    debug_assert_eq!(program.len() - 1, 2 + 6);
    debug_assert_eq!(program.len() - 1, 4 + 4);
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_mut_ptr(),
    };
    // SAFETY: `fprog` points at `program`, which outlives the call; the kernel copies it.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            std::ptr::from_ref(&fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn bind_one_underlay(listen: SocketAddr, shared: bool) -> Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(
        Domain::for_address(listen),
        Type::DGRAM,
        Some(Protocol::UDP),
    )?;
    // Best effort: the kernel caps these at net.core.{r,w}mem_max.
    let _ = socket.set_recv_buffer_size(SOCKET_BUFFER);
    let _ = socket.set_send_buffer_size(SOCKET_BUFFER);
    if shared {
        socket
            .set_reuse_port(true)
            .context("sharing the underlay port between workers (SO_REUSEPORT)")?;
    }
    socket.bind(&listen.into()).map_err(|e| match e.kind() {
        ErrorKind::AddrInUse => anyhow::anyhow!(
            "listen address {listen} is already in use (another hyphae agent, or set [agent] listen)"
        ),
        ErrorKind::AddrNotAvailable => {
            anyhow::anyhow!("listen address {listen} is not an address of this host")
        }
        _ => anyhow::anyhow!("cannot listen on {listen}: {e}"),
    })?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

pub(crate) fn bind_control(path: &Path) -> Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!(
                "another hyphae agent is running: its control socket {} answers",
                path.display()
            );
        }
        // A stale socket from an agent that was killed.
        let _ = std::fs::remove_file(path);
    }
    // The socket is created 0600 (root's only): with a chmod after bind, another user could
    // connect in between. The umask is process-wide, but no other thread creates files
    // while the agent starts.
    // SAFETY: umask(2) has no preconditions.
    let previous = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above.
    unsafe { libc::umask(previous) };
    bound.with_context(|| format!("cannot create control socket {}", path.display()))
}

/// Creates the namespace's TAP. With `offload`, it is opened with a virtio-net header and
/// TCP segmentation and checksum offloads (UDP segmentation too where the kernel has it);
/// if the kernel refuses them, without (a debug line says why). Returns the device and
/// whether offloads are on.
pub(crate) fn create_tap(
    ns: &Namespace,
    name: &str,
    mac: [u8; 6],
    offload: bool,
    queues: usize,
) -> Result<(SyncDevice, bool)> {
    if offload {
        match build_tap(ns, name, mac, true, queues) {
            Ok(device) => {
                tracing::debug!(
                    device = name,
                    udp = device.udp_gso(),
                    "TAP offloads on (TSO4/6, checksum)"
                );
                return Ok((device, true));
            }
            Err(e) => {
                tracing::debug!(device = name, error = %e, "TAP offloads refused: opening without")
            }
        }
    }
    Ok((build_tap(ns, name, mac, false, queues)?, false))
}

/// The other queues of a TAP opened with more than one (`IFF_MULTI_QUEUE`): one per worker
/// but the first, non-blocking. Which queue the kernel hands a frame to is
/// [`steer_tap`]'s.
pub(crate) fn more_queues(first: &SyncDevice, queues: usize) -> Result<Vec<SyncDevice>> {
    (1..queues)
        .map(|_| {
            let queue = first.try_clone().context("opening another TAP queue")?;
            queue
                .set_nonblocking(true)
                .context("setting the TAP queue non-blocking")?;
            Ok(queue)
        })
        .collect()
}

/// Has the kernel hand each IP flow's frames (IPv4 or IPv6) to queue `k` of the TAP, `k` being the
/// tunnel shard the flow is sealed on (`hyphae_overlay::flow_shard`, over at most
/// `MAX_SHARDS` shards), which worker `k` owns: a flow is read, sealed, received and
/// written by one worker at each end, from its first frame and for good
/// (`underlay::bpf::steering_program`, `TUNSETSTEERINGEBPF`, Linux 4.16; loading it takes
/// `CAP_BPF`, or `CAP_SYS_ADMIN` before Linux 5.8, unless unprivileged BPF is allowed).
///
/// Without it, tun picks the queue a flow's packets were last written on and, for a flow
/// none were written for in 3 s (a one-way stream: `TUN_FLOW_EXPIRE`), its own hash: such
/// a flow moved from one worker to the other after a few seconds, and both then sealed on
/// its one shard (docs/BENCHMARKS.md, "What the 64-byte figure measures").
pub(crate) fn steer_tap(tap: &SyncDevice, queues: usize) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    /// `_IOR('T', 224, int)` (linux/if_tun.h).
    const TUNSETSTEERINGEBPF: libc::c_ulong = 0x8004_54e0;
    let shards = queues.min(usize::from(hyphae_overlay::wire::MAX_SHARDS));
    let program = crate::underlay::bpf::load_steering(shards as u32)?;
    let fd: libc::c_int = program.as_raw_fd();
    // SAFETY: the TAP's descriptor is open; the kernel reads one int (the program's
    // descriptor, which it takes its own reference of) from a live local.
    let rc = unsafe { libc::ioctl(tap.as_raw_fd(), TUNSETSTEERINGEBPF as _, &fd) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn build_tap(
    ns: &Namespace,
    name: &str,
    mac: [u8; 6],
    offload: bool,
    queues: usize,
) -> Result<SyncDevice> {
    let mut builder = tun_rs::DeviceBuilder::new()
        .name(name)
        .layer(tun_rs::Layer::L2)
        .mac_addr(mac)
        .mtu(ns.tap_mtu())
        .offload(offload)
        .multi_queue(queues > 1)
        .enable(true);
    // An `auto` address is set once it is won; a static one once the subnet is known. Only
    // an interface-mode TAP carries the address (router: none; hybrid: the veth does).
    if let (Mode::Interface, Address::Static(a), Some(subnet)) = (ns.mode, ns.address, ns.subnet) {
        builder = builder.ipv4(a, subnet.prefix_len(), None);
    }
    let device = builder.build_sync().map_err(|e| match e.raw_os_error() {
        Some(libc::EBUSY) | Some(libc::EEXIST) => anyhow::anyhow!(
            "namespace '{}': device {name} already exists and is in use; pick another `device`",
            ns.name,
        ),
        _ => anyhow::anyhow!("namespace '{}': cannot create TAP {name}: {e}", ns.name),
    })?;
    // A bridge port speaks for no one, and an IPv4-only namespace carries no IPv6: keep
    // the kernel's IPv6 chatter (router solicitations, DAD) off such a device. Best effort:
    // IPv6 may be disabled host-wide already. An interface member's device carries IPv6 in
    // a dual-stack namespace, and every frame in a layer-2 one.
    let ipv6 = ns.mode == Mode::Interface
        && (ns.layer2 || (ns.subnet6 != Subnet6::Off && ns.address6 != Address6::None));
    if !ipv6 {
        let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6"), "1");
    }
    device
        .set_nonblocking(true)
        .context("setting the TAP non-blocking")?;
    Ok(device)
}

/// A MAC that stays the same across restarts (LAN hosts' ARP caches stay right) and differs
/// between agents: `first` plus four bytes of a hash of the agent's identity and `label`.
pub(crate) fn stable_mac(first: [u8; 2], id: &PeerId, label: &str) -> [u8; 6] {
    use blake2::{Blake2s256, Digest};
    let h = Blake2s256::new()
        .chain_update(id.as_bytes())
        .chain_update(label.as_bytes())
        .finalize();
    [first[0], first[1], h[0], h[1], h[2], h[3]]
}

/// The remote MAC of every router-mode agent of the namespace tagged `tag`: one MAC, as a
/// distributed router port has (OVN), so a LAN host that moves to another site keeps a
/// valid ARP cache (QEMU's live migration keeps the guest's; a per-agent MAC there would
/// leave its traffic to remote members addressed to the old router until it asks again).
pub(crate) fn router_remote_mac(tag: &[u8]) -> [u8; 6] {
    use blake2::{Blake2s256, Digest};
    let h = Blake2s256::new()
        .chain_update(tag)
        .chain_update(b"router remote")
        .finalize();
    let [a, b] = hyphae_vswitch::REMOTE_MAC_PREFIX;
    [a, b, h[0], h[1], h[2], h[3]]
}

/// The default config path.
pub fn default_config_path() -> PathBuf {
    PathBuf::from("/etc/hyphae/hyphae.toml")
}

/// Where the last address won in namespace `name` is kept.
pub(crate) fn state_file(state_dir: &Path, name: &str) -> PathBuf {
    state_dir.join(format!("{name}.address"))
}

/// Where the newest revocation list of namespace `name` is kept (armored).
pub(crate) fn revocations_file(state_dir: &Path, name: &str) -> PathBuf {
    state_dir.join(format!("{name}.revocations"))
}

/// Where the newest signed policy of namespace `name` is kept (armored).
pub(crate) fn policy_file(state_dir: &Path, name: &str) -> PathBuf {
    state_dir.join(format!("{name}.policy"))
}

/// Where the members an agent had tunnels with in namespace `name` are kept: one
/// `identity endpoint` a line.
pub(crate) fn members_file(state_dir: &Path, name: &str) -> PathBuf {
    state_dir.join(format!("{name}.members"))
}

/// The tunnel endpoints of the members this agent had tunnels with in namespace `name`
/// when it last ran (their identities are there for the operator: a hello tells them
/// anew); lines that do not parse are skipped.
pub(crate) fn remembered_members(state_dir: &Path, name: &str) -> Vec<SocketAddr> {
    let text = std::fs::read_to_string(members_file(state_dir, name)).unwrap_or_default();
    text.lines()
        .filter_map(|line| line.split_whitespace().nth(1)?.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    /// Sockets bound in order to one port on loopback, a sender with one address and port
    /// (so the kernel's hash alone would pick one socket for all): a data message of shard
    /// `k` reaches socket `k`, whatever else it carries; anything else reaches one socket.
    #[test]
    fn data_messages_reach_the_socket_of_their_shard() {
        let sockets = bind_underlay("127.0.0.1:0".parse().unwrap(), 1).unwrap();
        let port = sockets[0].local_addr().unwrap().port();
        drop(sockets);
        let listen: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let sockets = bind_underlay(listen, 4).unwrap();
        for s in &sockets {
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(std::time::Duration::from_millis(40)))
                .unwrap();
        }
        let sender = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let receiver_of = |datagram: &[u8]| -> Vec<usize> {
            sender.send_to(datagram, listen).unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 256];
            for (i, s) in sockets.iter().enumerate() {
                if let Ok((n, _)) = s.recv_from(&mut buf) {
                    assert_eq!(&buf[..n], datagram);
                    got.push(i);
                }
            }
            got
        };
        for shard in 0..4u8 {
            for slot in [0u32, 7, 4095] {
                let receiver = (slot | u32::from(shard) << 12) << 8 | 3;
                let mut data = vec![4u8, 0, 0, 0];
                data.extend_from_slice(&receiver.to_le_bytes());
                data.extend_from_slice(&[0x5a; 40]);
                assert_eq!(receiver_of(&data), [usize::from(shard)], "shard {shard}");
            }
        }
        // A handshake, a hello, a short datagram: one socket each, by the hash.
        for other in [&[1u8; 148][..], &b"H hello"[..], &[4u8; 8][..]] {
            assert_eq!(receiver_of(other).len(), 1);
        }
    }

    #[test]
    fn the_control_socket_is_created_for_its_owner_only() {
        let dir = std::env::temp_dir().join(format!("hyphae-ctl-{}", std::process::id()));
        let path = dir.join("run").join("hyphae.sock");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _listener = runtime.block_on(async { bind_control(&path) }).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
