#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Data-path workers end to end: two agents with four workers each, in network namespaces,
//! carrying UDP flows that iperf3 counts. Each flow must stay on one worker from the
//! sender's TAP queue to the receiver's, for longer than tun's flow table keeps a flow (a
//! one-way flow used to move after 3 s), so the receiver sees no datagram out of order;
//! flows must spread over the workers; and every packet must be sealed by the worker that
//! owns its flow's shard (the TAP's steering program picks the queue the way the tunnel
//! picks the shard).
//!
//! Needs root, iproute2, ping, iperf3 and python3 (`scripts/test` installs them). Never skips:
//! without root it fails and says why.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use hyphae_agent::control::WorkerStatus;
use hyphae_testbed::{agent_config, require_root, AgentHandle, Host, Testbed};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");
const SUBNET: &str = "10.201.0.0/16";
const WORKERS: usize = 4;

fn underlay(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 200, 0, i)
}

fn vip(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 201, 0, 10 + i)
}

fn workers(bed: &Testbed, host: &Host, agent: &AgentHandle) -> Vec<WorkerStatus> {
    bed.status(host, agent).expect("status").workers
}

/// Per worker, how much `field` grew between `before` and `after`.
fn grew(
    before: &[WorkerStatus],
    after: &[WorkerStatus],
    field: fn(&WorkerStatus) -> u64,
) -> Vec<u64> {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| field(a) - field(b))
        .collect()
}

/// Two hosts of a testbed named `name`, each with an agent whose `[agent]` section has
/// `agent_lines` too, each the other's static peer.
fn pair(name: &str, agent_lines: &str) -> (Testbed, Vec<Host>, Vec<AgentHandle>) {
    let mut bed = Testbed::new(name, Path::new(BIN)).expect("testbed");
    let secret = bed.dir().join("lab.secret");
    hyphae_testbed::write_secret(&secret, "a namespace secret for tests\n").expect("secret");
    let hosts: Vec<Host> = (1..=2)
        .map(|i| bed.add_host(&format!("h{i}"), underlay(i)).expect("host"))
        .collect();
    let mut agents = Vec::new();
    for (i, host) in hosts.iter().enumerate() {
        let me = i as u8 + 1;
        let cfg = agent_config(host, "lab", &secret, SUBNET, vip(me), &[underlay(3 - me)])
            .replacen("[agent]\n", &format!("[agent]\n{agent_lines}"), 1);
        agents.push(bed.start_agent(host, &cfg).expect("agent"));
    }
    (bed, hosts, agents)
}

/// iperf3 UDP from `from` to `to` with `streams` parallel flows of 1200-byte datagrams; the
/// receiver's count of datagrams sent, lost and out of order (summed over the flows).
fn udp_flows(
    bed: &mut Testbed,
    from: &Host,
    to: &Host,
    port: u16,
    streams: u32,
    secs: u32,
) -> (u64, u64, u64) {
    let port = port.to_string();
    let log = to.dir.join(format!("iperf3-{port}.log"));
    bed.spawn(&to.ns, "iperf3", &["-s", "-1", "-p", &port], &log)
        .expect("iperf3 server");
    std::thread::sleep(Duration::from_millis(300));
    let out = bed
        .ns(
            &from.ns,
            "iperf3",
            &[
                "-c",
                &vip(2).to_string(),
                "-p",
                &port,
                "-u",
                "-b",
                "100M",
                "-l",
                "1200",
                "-t",
                &secs.to_string(),
                "-P",
                &streams.to_string(),
                "-J",
            ],
        )
        .expect("iperf3 client");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("iperf3 -J");
    let flows = report["end"]["streams"].as_array().expect("streams");
    assert_eq!(flows.len(), streams as usize, "{report}");
    let mut totals = (0, 0, 0);
    for flow in flows {
        let udp = &flow["udp"];
        let count = |key: &str| {
            udp[key]
                .as_u64()
                .unwrap_or_else(|| panic!("iperf3 reports no {key}: {udp}"))
        };
        totals.0 += count("packets");
        totals.1 += count("lost_packets");
        totals.2 += count("out_of_order");
    }
    totals
}

#[test]
fn a_flow_stays_on_one_worker_and_flows_spread_over_workers() {
    require_root();
    let (mut bed, hosts, agents) = pair("workers", &format!("workers = {WORKERS}\n"));
    bed.wait_for_ping(&hosts[0], vip(2), Duration::from_secs(20))
        .expect("first contact");
    for (host, agent) in hosts.iter().zip(&agents) {
        assert_eq!(workers(&bed, host, agent).len(), WORKERS);
        let text = bed
            .ns(
                &host.ns,
                BIN,
                &["status", "-c", &agent.config.display().to_string()],
            )
            .expect("status");
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(text.contains("workers 4  frames from devices "), "{text}");
    }

    // One flow, one way, for twice as long as tun's flow table keeps it (3 s): read by one
    // of h1's workers, received and written by one of h2's.
    let (h1_before, h2_before) = (
        workers(&bed, &hosts[0], &agents[0]),
        workers(&bed, &hosts[1], &agents[1]),
    );
    let (packets, lost, out_of_order) = udp_flows(&mut bed, &hosts[0], &hosts[1], 5201, 1, 6);
    let (h1_after, h2_after) = (
        workers(&bed, &hosts[0], &agents[0]),
        workers(&bed, &hosts[1], &agents[1]),
    );
    let read = grew(&h1_before, &h1_after, |w| w.frames_in);
    let received = grew(&h2_before, &h2_after, |w| w.datagrams_in);
    let written = grew(&h2_before, &h2_after, |w| w.frames_out);
    eprintln!(
        "one flow: {packets} datagrams, {lost} lost, {out_of_order} out of order; h1 read {read:?}, \
         h2 received {received:?} and wrote {written:?}"
    );
    assert!(
        packets > 10_000 && lost * 10 < packets,
        "{packets} sent, {lost} lost"
    );
    assert_eq!(out_of_order, 0, "the receiver saw datagrams out of order");
    // Besides the flow only pings and keepalives move: the flow's worker carries nearly all.
    for (what, counts) in [("read", &read), ("received", &received)] {
        let total: u64 = counts.iter().sum();
        let top = counts.iter().max().copied().unwrap_or(0);
        assert!(
            top * 100 >= total * 99,
            "the flow was {what} by more than one worker: {counts:?}"
        );
    }
    let receiver = received
        .iter()
        .position(|&c| c == *received.iter().max().unwrap());
    let writer = written
        .iter()
        .position(|&c| c == *written.iter().max().unwrap());
    assert_eq!(receiver, writer, "h2 wrote the flow from another worker");

    // Eight flows to one member: each stays in order, and they spread over the workers at
    // both ends. The tunnel has a WireGuard session per worker (shards), each flow is
    // sealed on the shard its hash picks, h2's socket group hands shard k to worker k, and
    // h1's TAP hands the flow's frames to queue k, worker k's.
    for (host, agent) in hosts.iter().zip(&agents) {
        let status = bed.status(host, agent).expect("status");
        let shards: Vec<usize> = status.namespaces[0]
            .peers
            .iter()
            .map(|p| p.shards)
            .collect();
        assert_eq!(shards, [WORKERS], "one shard per worker");
    }
    let (h1_before, h2_before) = (
        workers(&bed, &hosts[0], &agents[0]),
        workers(&bed, &hosts[1], &agents[1]),
    );
    let (packets, lost, out_of_order) = udp_flows(&mut bed, &hosts[0], &hosts[1], 5202, 8, 3);
    let read = grew(&h1_before, &workers(&bed, &hosts[0], &agents[0]), |w| {
        w.frames_in
    });
    let received = grew(&h2_before, &workers(&bed, &hosts[1], &agents[1]), |w| {
        w.datagrams_in
    });
    eprintln!(
        "eight flows: {packets} datagrams, {lost} lost, {out_of_order} out of order; h1 read \
         {read:?}, h2 received {received:?}"
    );
    assert!(
        packets > 10_000 && lost * 10 < packets,
        "{packets} sent, {lost} lost"
    );
    assert_eq!(out_of_order, 0, "the receiver saw datagrams out of order");
    // All eight on one shard of four: a chance of 4 in 4^8.
    for (what, counts) in [("read by h1", &read), ("received by h2", &received)] {
        let total: u64 = counts.iter().sum();
        let busy = counts.iter().filter(|&&c| c * 10 >= total).count();
        assert!(
            busy >= 2,
            "one member's flows were {what} on one worker: {counts:?}"
        );
    }

    // Flows that nothing answers stay on the queue their hash picks: sixteen of them are
    // read by several of h1's workers (all on one of four: a chance of 4 in 4^16).
    let before = workers(&bed, &hosts[0], &agents[0]);
    let script = format!(
        "import socket\n\
         for port in range(6000, 6016):\n\
         \x20   s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         \x20   for _ in range(250): s.sendto(b'x' * 64, ('{}', port))\n",
        vip(2)
    );
    let sent = bed
        .ns(&hosts[0].ns, "python3", &["-c", &script])
        .expect("python3");
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    let read = grew(&before, &workers(&bed, &hosts[0], &agents[0]), |w| {
        w.frames_in
    });
    eprintln!("sixteen unanswered flows: h1 read {read:?}");
    let busy = read.iter().filter(|&&c| c >= 200).count();
    assert!(busy >= 2, "sixteen flows were read by one worker: {read:?}");

    // Every packet of the whole test was sealed by the worker owning its shard, at both
    // ends: with four shards per tunnel and four workers, the TAP's steering program and
    // the tunnel agree on every flow.
    for (host, agent) in hosts.iter().zip(&agents) {
        let elsewhere: Vec<u64> = workers(&bed, host, agent)
            .iter()
            .map(|w| w.sealed_elsewhere)
            .collect();
        eprintln!(
            "{}: sealed on another worker's shard {elsewhere:?}",
            host.name
        );
        assert!(
            elsewhere.iter().all(|&n| n == 0),
            "{}: packets sealed by a worker that does not own their shard: {elsewhere:?}",
            host.name
        );
    }
}

/// The scheduling policy of each of `pid`'s threads whose name `named` accepts:
/// `libc::SCHED_OTHER` (0) or `libc::SCHED_FIFO` (1), as `sched_getscheduler` gives it.
fn policies(pid: u32, named: fn(&str) -> bool) -> Vec<i32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("the agent's threads") {
        let task = task.expect("a thread").path();
        let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        if !named(comm.trim()) {
            continue;
        }
        let tid: i32 = task
            .file_name()
            .and_then(|t| t.to_str())
            .and_then(|t| t.parse().ok())
            .expect("a thread id");
        // SAFETY: a plain query of another thread's policy.
        let policy = unsafe { libc::sched_getscheduler(tid) };
        assert!(policy >= 0, "sched_getscheduler({tid}) failed");
        out.push(policy);
    }
    out
}

/// `worker_priority = "realtime"`: the workers run as SCHED_FIFO threads (status says so),
/// the control thread stays an ordinary one, and traffic crosses.
#[test]
fn realtime_workers_are_fifo_threads_and_the_control_thread_is_not() {
    require_root();
    let (bed, hosts, agents) = pair("rtworkers", "workers = 2\nworker_priority = \"realtime\"\n");
    bed.wait_for_ping(&hosts[0], vip(2), Duration::from_secs(20))
        .expect("a ping between realtime agents");
    for (host, agent) in hosts.iter().zip(&agents) {
        let status = workers(&bed, host, agent);
        assert_eq!(status.len(), 2);
        assert!(status.iter().all(|w| w.realtime), "status: not realtime");
        assert_eq!(
            policies(agent.pid, |c| c.starts_with("hyphae-worker-")),
            [libc::SCHED_FIFO; 2],
            "SCHED_FIFO"
        );
        assert_eq!(
            policies(agent.pid, |c| c == "hyphae"),
            [libc::SCHED_OTHER],
            "the control thread"
        );
    }
}

/// `worker_priority = "realtime"` without the right to it (no CAP_SYS_NICE, an
/// `RLIMIT_RTPRIO` of 0): the agent says so once and its workers run as ordinary threads.
#[test]
fn refused_realtime_is_said_once_and_the_workers_run_normally() {
    require_root();
    let mut bed = Testbed::new("rtrefused", Path::new(BIN)).expect("testbed");
    let secret = bed.dir().join("lab.secret");
    hyphae_testbed::write_secret(&secret, "a namespace secret for tests\n").expect("secret");
    let host = bed.add_host("h1", underlay(1)).expect("host");
    let config = host.dir.join("hyphae.toml");
    let text = agent_config(&host, "lab", &secret, SUBNET, vip(1), &[underlay(2)]).replacen(
        "[agent]\n",
        "[agent]\nworkers = 2\nworker_priority = \"realtime\"\n",
        1,
    );
    std::fs::write(&config, text).expect("config");
    let log = host.dir.join("agent.log");
    let config_arg = config.display().to_string();
    // setpriv execs the agent: its PID is the agent's.
    let pid = bed
        .spawn(
            &host.ns,
            "setpriv",
            &[
                "--bounding-set=-sys_nice",
                "--",
                BIN,
                "up",
                "-c",
                &config_arg,
            ],
            &log,
        )
        .expect("the agent without CAP_SYS_NICE");
    let agent = AgentHandle { pid, config, log };
    // Up to 10 s for its control socket.
    let mut status = None;
    for _ in 0..200 {
        status = bed.status(&host, &agent).ok();
        if status.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = status.unwrap_or_else(|| {
        panic!(
            "the agent did not start: {}",
            std::fs::read_to_string(&agent.log).unwrap_or_default()
        )
    });
    assert_eq!(status.workers.len(), 2);
    assert!(
        status.workers.iter().all(|w| !w.realtime),
        "status: realtime"
    );
    assert_eq!(
        policies(agent.pid, |c| c.starts_with("hyphae-worker-")),
        [libc::SCHED_OTHER; 2]
    );
    let text = std::fs::read_to_string(&agent.log).expect("the agent's log");
    assert_eq!(
        text.matches("was refused").count(),
        1,
        "one warning, naming the refusal: {text}"
    );
}
