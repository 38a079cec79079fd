//! `[agent] underlay` and `[agent] workers`: how tunnel datagrams enter and leave the host,
//! and how many data-path threads carry them.

use anyhow::{bail, Result};

/// Most data-path workers (`[agent] workers`).
pub const MAX_WORKERS: usize = 64;

/// `[agent] workers`: as given (1..=[`MAX_WORKERS`]), else one per core (at most
/// [`MAX_WORKERS`]). AF_XDP has one socket per NIC queue, which the workers do not share
/// out yet: with it the agent runs one worker.
pub(super) fn workers(given: Option<usize>, underlay: UnderlayMode) -> Result<usize> {
    match (given, underlay) {
        (Some(n), _) if n == 0 || n > MAX_WORKERS => {
            bail!("{n} workers: give 1 to {MAX_WORKERS}, or leave it out for one per core")
        }
        (Some(n), UnderlayMode::AfXdp | UnderlayMode::Auto) if n > 1 => {
            bail!("{n} workers need underlay = \"socket\"; AF_XDP runs one worker")
        }
        (Some(n), _) => Ok(n),
        (None, UnderlayMode::Socket) => Ok(std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(MAX_WORKERS)),
        (None, UnderlayMode::AfXdp | UnderlayMode::Auto) => Ok(1),
    }
}

/// `[agent] worker_priority`: how the kernel schedules the data-path workers.
///
/// `realtime` gives them what an in-kernel tunnel (WireGuard, VXLAN) has by running in
/// softirq: a packet's worker runs the moment it is woken, ahead of every ordinary thread,
/// the agent's control thread included. The cost: a woken worker no longer waits for more
/// packets to gather, so it runs more, smaller batches (more CPU at moderate rates), and
/// under a flood the workers may take every core they run on but the share the kernel keeps
/// for ordinary threads (5% by default: `kernel.sched_rt_runtime_us`), which is then all
/// the control plane has. It needs CAP_SYS_NICE or an `RLIMIT_RTPRIO` of at least
/// [`REALTIME_PRIORITY`] (systemd: `LimitRTPRIO=` and `RestrictRealtime=no`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WorkerPriority {
    /// Ordinary threads (`"normal"`, the default).
    #[default]
    Normal,
    /// `SCHED_FIFO` at [`REALTIME_PRIORITY`] (`"realtime"`).
    Realtime,
}

/// The `SCHED_FIFO` priority of realtime workers: above every ordinary thread, below the
/// kernel's threaded interrupt handlers (50), so the NIC's own work still comes first.
pub const REALTIME_PRIORITY: i32 = 10;

impl WorkerPriority {
    pub(super) fn parse(text: Option<&str>) -> Result<Self> {
        match text {
            None | Some("normal") => Ok(Self::Normal),
            Some("realtime") => Ok(Self::Realtime),
            Some(other) => bail!("'{other}' is not \"normal\" or \"realtime\""),
        }
    }
}

/// `[agent] underlay`: the UDP socket alone, or AF_XDP beside it.
///
/// The default is `socket`: AF_XDP puts an XDP program on the interface (which another
/// XDP user, a CNI say, may already own), needs CAP_BPF and CAP_NET_RAW besides
/// CAP_NET_ADMIN, and on virtual NICs (veth, most cloud NICs without zero-copy) runs in
/// copy mode, where it is no faster than the socket. It is a choice a user makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnderlayMode {
    /// The UDP socket (`"socket"`).
    Socket,
    /// AF_XDP, falling back to the socket with a warning (`"af_xdp"`).
    AfXdp,
    /// AF_XDP where it attaches, else the socket, said at info level (`"auto"`).
    Auto,
}

impl UnderlayMode {
    pub(super) fn parse(text: &str) -> Result<Self> {
        match text {
            "socket" => Ok(Self::Socket),
            "af_xdp" => Ok(Self::AfXdp),
            "auto" => Ok(Self::Auto),
            other => bail!("'{other}' is not an underlay; use \"socket\", \"af_xdp\" or \"auto\""),
        }
    }
}
