//! The AF_XDP path of the underlay: the project's XDP program on the interface that
//! carries the listen address, one AF_XDP socket per receive queue, and frames built here
//! (Ethernet, IPv4, UDP) for destinations whose next hop the kernel resolved.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hyphae_vswitch::udp::{self, IPV4_OVERHEAD};
use hyphae_vswitch::Mac;

use super::bpf;
use super::neighbour::Neighbours;
use super::xsk::{RxFrame, Xsk, FRAME_SIZE};

/// How often the kernel's routes and ARP table are read again: a new peer's first
/// datagrams go through the socket (which has the kernel resolve it) for at most this long.
const NEIGHBOUR_REFRESH: Duration = Duration::from_secs(1);

/// The longest frame a socket receives: a UMEM frame less the headroom copy mode leaves
/// before the data (XDP_PACKET_HEADROOM, 256). The XDP program passes longer ones to the
/// kernel (a jumbo-MTU underlay), whose UDP socket takes them.
const MAX_RX_FRAME: usize = FRAME_SIZE - 256;

/// Most payload a frame we send carries: what an AF_XDP peer receives whole.
pub(crate) const MAX_PAYLOAD: usize = MAX_RX_FRAME - IPV4_OVERHEAD;

/// What became of a datagram offered to [`AfXdp::push`].
pub(crate) enum Push {
    /// On the tx ring; leaves at the next flush.
    Queued,
    /// No frame or ring slot free: flush, then offer it again.
    Full,
    /// Not for this path (IPv6, too long, next hop unresolved): the socket sends it.
    Unroutable,
}

/// Counters of the AF_XDP path.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Stats {
    pub(crate) rx_frames: u64,
    pub(crate) tx_frames: u64,
    /// Datagrams the socket sent instead (next hop unresolved, IPv6, too long).
    pub(crate) tx_via_socket: u64,
    /// Redirected frames that held no datagram for us.
    pub(crate) malformed: u64,
    pub(crate) send_errors: u64,
}

/// A datagram received on socket `socket`: where its payload lies in `frame`.
struct Received {
    socket: usize,
    frame: RxFrame,
    from: SocketAddr,
    payload: Range<usize>,
}

/// The attached program and its sockets.
pub(crate) struct AfXdp {
    // Fields drop in order: the program detaches before its map and sockets close.
    _link: OwnedFd,
    _program: OwnedFd,
    _map: OwnedFd,
    sockets: Vec<Xsk>,
    pub(crate) interface: String,
    /// "native" (in the driver) or "generic" (after the kernel built a socket buffer).
    pub(crate) xdp_mode: &'static str,
    local: SocketAddr,
    local_mac: Mac,
    neighbours: Neighbours,
    next_refresh: Option<Instant>,
    ip_id: u16,
    received: Vec<Received>,
    frames: Vec<RxFrame>,
    pub(crate) stats: Stats,
}

impl AfXdp {
    /// Attaches to the interface of `listen` (the default route's when it is 0.0.0.0).
    #[allow(clippy::disallowed_methods)] // the first refresh: the tables were just read
    pub(crate) fn open(listen: SocketAddr) -> Result<Self> {
        let (interface, local_ip) = interface_for(listen.ip())?;
        let c_name = std::ffi::CString::new(interface.clone())?;
        // SAFETY: a NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(c_name.as_ptr()) };
        if ifindex == 0 {
            bail!("interface {interface}: {}", std::io::Error::last_os_error());
        }
        let queues = rx_queues(&interface);
        let map = bpf::create_xsk_map(queues)
            .context("creating the XSKMAP (needs CAP_BPF and CAP_NET_ADMIN)")?;
        let program = bpf::load(listen.port(), MAX_RX_FRAME as u16, &map)
            .context("loading the XDP program")?;
        let (link, xdp_mode) = match bpf::attach(&program, ifindex, bpf::XDP_FLAGS_DRV_MODE) {
            Ok(link) => (link, "native"),
            Err(native) => match bpf::attach(&program, ifindex, bpf::XDP_FLAGS_SKB_MODE) {
                Ok(link) => (link, "generic"),
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("attaching XDP to {interface} (native: {native})")
                    })
                }
            },
        };
        let mut sockets = Vec::new();
        for queue in 0..queues {
            // Zero-copy needs the driver's own XDP support; generic XDP copies anyway.
            let xsk = Xsk::open(ifindex, queue, xdp_mode == "native").with_context(|| {
                format!("AF_XDP socket on {interface} queue {queue} (needs CAP_NET_RAW)")
            })?;
            bpf::set_xsk(&map, queue, xsk.raw_fd()).context("filling the XSKMAP")?;
            sockets.push(xsk);
        }
        let local_mac = interface_mac(&interface)?;
        let mut neighbours = Neighbours::default();
        neighbours.refresh(&interface);
        Ok(Self {
            _link: link,
            _program: program,
            _map: map,
            sockets,
            interface,
            xdp_mode,
            local: SocketAddr::new(local_ip, listen.port()),
            local_mac,
            neighbours,
            // The one clock reading outside the loop: the tables were just read.
            next_refresh: Some(Instant::now() + NEIGHBOUR_REFRESH),
            ip_id: 0,
            received: Vec::with_capacity(super::xsk::RX_BATCH),
            frames: Vec::with_capacity(super::xsk::RX_BATCH),
            stats: Stats::default(),
        })
    }

    /// Sockets (one per receive queue).
    pub(crate) fn queues(&self) -> usize {
        self.sockets.len()
    }

    /// Whether every socket moves frames without copying them.
    pub(crate) fn zero_copy(&self) -> bool {
        self.sockets.iter().all(|s| s.zero_copy)
    }

    /// Ready when any socket's rx ring holds frames.
    pub(crate) async fn readable(&self) -> std::io::Result<()> {
        std::future::poll_fn(|cx| {
            for s in &self.sockets {
                if let std::task::Poll::Ready(r) = s.poll_readable(cx) {
                    return std::task::Poll::Ready(r);
                }
            }
            std::task::Poll::Pending
        })
        .await
    }

    /// Returns the last batch's frames to the kernel and takes a new batch; `true` if
    /// any frame came.
    pub(crate) fn try_recv(&mut self) -> bool {
        self.received.clear();
        let mut any = false;
        for (i, s) in self.sockets.iter_mut().enumerate() {
            s.recycle();
            self.frames.clear();
            if s.recv(&mut self.frames) == 0 {
                continue;
            }
            any = true;
            for &f in &self.frames {
                self.stats.rx_frames += 1;
                match udp::parse(s.frame(f)) {
                    Ok(d) if d.to.port() == self.local.port() => self.received.push(Received {
                        socket: i,
                        frame: f,
                        from: d.from,
                        payload: d.payload,
                    }),
                    _ => self.stats.malformed += 1,
                }
            }
        }
        any
    }

    /// The datagrams of the last batch.
    pub(crate) fn datagrams(&self) -> impl Iterator<Item = super::Datagram<'_>> {
        self.received.iter().filter_map(|r| {
            let bytes = self.sockets[r.socket]
                .frame(r.frame)
                .get(r.payload.clone())?;
            Some(super::Datagram {
                from: r.from,
                bytes,
            })
        })
    }

    /// Queues `datagram` to `to` if this path can carry it.
    pub(crate) fn push(&mut self, to: SocketAddr, datagram: &[u8]) -> Push {
        let (IpAddr::V4(dst), IpAddr::V4(_)) = (to.ip(), self.local.ip()) else {
            return Push::Unroutable;
        };
        if datagram.len() > MAX_PAYLOAD {
            return Push::Unroutable;
        }
        let Some(mac) = self.neighbours.next_hop(&self.interface, dst) else {
            return Push::Unroutable;
        };
        let Some(socket) = self.sockets.first_mut() else {
            return Push::Unroutable;
        };
        let (local, local_mac, id) = (self.local, self.local_mac, self.ip_id);
        if socket.queue(|buf| udp::emit(buf, (mac, local_mac), local, to, id, datagram).ok()) {
            self.ip_id = self.ip_id.wrapping_add(1);
            self.stats.tx_frames += 1;
            Push::Queued
        } else {
            Push::Full
        }
    }

    /// Sends what is queued.
    pub(crate) async fn flush(&mut self) {
        for s in &mut self.sockets {
            self.stats.send_errors += s.flush().await;
        }
    }

    /// When the neighbour table is read next.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.next_refresh
    }

    /// Reads the kernel's routes and neighbours when due.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        if self.next_refresh.is_some_and(|t| t <= now) {
            self.neighbours.refresh(&self.interface);
            self.next_refresh = Some(now + NEIGHBOUR_REFRESH);
        }
    }
}

/// The interface holding `ip` and the address frames leave from; for 0.0.0.0, the
/// interface of the IPv4 default route and its first address.
fn interface_for(ip: IpAddr) -> Result<(String, IpAddr)> {
    let addresses = interface_addresses()?;
    if ip.is_unspecified() {
        let routes = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
        let default = super::neighbour::parse_routes(&routes)
            .into_iter()
            .find(|r| r.prefix == 0)
            .context("listen is 0.0.0.0 and there is no IPv4 default route: set [agent] listen to an address of the interface to attach to")?;
        let local = addresses
            .iter()
            .find(|(name, a)| *name == default.interface && a.is_ipv4())
            .map(|(_, a)| *a)
            .with_context(|| format!("{} has no IPv4 address", default.interface))?;
        return Ok((default.interface, local));
    }
    addresses
        .into_iter()
        .find(|(_, a)| *a == ip)
        .with_context(|| format!("no interface has the listen address {ip}"))
}

/// Every (interface, address) pair of the host (`getifaddrs`).
fn interface_addresses() -> Result<Vec<(String, IpAddr)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        bail!("getifaddrs: {}", std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a NUL-terminated name owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr points to a sockaddr of the family it names.
        let ip = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = &*ifa.ifa_addr.cast::<libc::sockaddr_in>();
                    IpAddr::V4(Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()))
                }
                libc::AF_INET6 => {
                    let sin6 = &*ifa.ifa_addr.cast::<libc::sockaddr_in6>();
                    IpAddr::V6(sin6.sin6_addr.s6_addr.into())
                }
                _ => continue,
            }
        };
        out.push((name, ip));
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// Receive queues of `interface` (`/sys/class/net/IF/queues/rx-N`), at least one.
fn rx_queues(interface: &str) -> u32 {
    std::fs::read_dir(format!("/sys/class/net/{interface}/queues"))
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
                .count() as u32
        })
        .unwrap_or(1)
        .max(1)
}

/// The MAC address of `interface`.
fn interface_mac(interface: &str) -> Result<Mac> {
    let path = format!("/sys/class/net/{interface}/address");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let mut mac = [0u8; 6];
    let mut parts = text.trim().split(':');
    for b in &mut mac {
        *b = parts
            .next()
            .and_then(|p| u8::from_str_radix(p, 16).ok())
            .with_context(|| format!("{path}: '{}' is not a MAC address", text.trim()))?;
    }
    Ok(mac)
}
