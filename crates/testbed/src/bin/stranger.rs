//! `hyphae-stranger`: a crowd of strangers on one agent's libp2p port, for
//! `benches/isolation.sh` (control-plane load on an agent). N identities without the
//! namespace secret, one libp2p connection each to TARGET (and to nothing else: every other
//! address is refused before any packet leaves), each doing a Kademlia query now and then
//! and answering the agent's challenges as a Sybil does (`hyphae_testbed::hostile`). Runs
//! in the caller's network namespace (`ip netns exec NS hyphae-stranger ...`) until killed,
//! printing how many identities are connected every 5 seconds.
//!
//! Usage: `hyphae-stranger TARGET IDENTITIES QUERY_EVERY_SECS SOURCE...`, e.g.
//! `hyphae-stranger 10.210.0.2:7400 300 10 10.210.1.1 10.210.1.2`: connections come from
//! the SOURCE addresses in turn (an agent admits 32 connections per source address).

use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use hyphae_testbed::hostile::{run_crowd, Crowd};

const USAGE: &str =
    "usage: hyphae-stranger TARGET_IP:PORT IDENTITIES QUERY_EVERY_SECS SOURCE_IP...";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hyphae-stranger: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn parse() -> Result<Crowd> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 4 {
        bail!("{USAGE}");
    }
    let target: SocketAddr = args[0]
        .parse()
        .with_context(|| format!("target {}", args[0]))?;
    let identities: u32 = args[1]
        .parse()
        .with_context(|| format!("identities {}", args[1]))?;
    let secs: f64 = args[2]
        .parse()
        .with_context(|| format!("query period {}", args[2]))?;
    let query_every = Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero())
        .with_context(|| format!("query period {secs}: want seconds above 0"))?;
    let sources = args[3..]
        .iter()
        .map(|s| {
            s.parse::<Ipv4Addr>()
                .with_context(|| format!("source address {s}"))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Crowd {
        target,
        sources,
        identities,
        query_every,
    })
}

fn run() -> Result<()> {
    let crowd = parse()?;
    let total = crowd.identities;
    let up = Arc::new(AtomicU32::new(0));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let report = up.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(5));
            every.tick().await;
            loop {
                every.tick().await;
                eprintln!(
                    "hyphae-stranger: {} of {total} connected",
                    report.load(Ordering::Relaxed)
                );
            }
        });
        run_crowd(crowd, up).await
    })
}
