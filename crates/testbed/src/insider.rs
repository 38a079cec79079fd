//! A member gone bad (issue 27, `crates/agent/tests/certs.rs`): it holds the namespace
//! secret and a certificate (its own, one for another namespace of the same authority, or
//! a revoked one), answers an agent's membership challenge with them as a real agent
//! would, and then sends that agent record requests no real agent sends: claims of names
//! and addresses its certificate does not give it, claims that lie about what they are on.
//! It returns each answer, so a test can say which the agent refused and why.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use futures::StreamExt;
use hyphae_overlay::proof::{Credential, ProofRequest, ProofResponse, Proofs, PROOF_LEN};
use hyphae_overlay::records::{RecordRequest, RecordResponse, ScopedRequest};
use hyphae_overlay::{Identity, NamespaceKeys};
use libp2p::request_response::{self, Message};
use libp2p::swarm::SwarmEvent;
use libp2p::Multiaddr;

use crate::hostile::{swarm, HostileEvent};

/// Who the insider is and what it asks.
pub struct Insider {
    /// Its identity (the certificate's).
    pub identity: Identity,
    /// The namespace's keys (it holds the secret).
    pub keys: NamespaceKeys,
    /// What it proves membership with: the authority it trusts and its certificate.
    pub credential: Credential,
    /// An agent's libp2p address, `/ip4/A/tcp/P`.
    pub target: Multiaddr,
    /// The requests, each with a label for the test's messages.
    pub requests: Vec<(String, RecordRequest)>,
}

/// Runs `insider` from inside network namespace `ns` (a testbed host's) until every
/// request is answered or `timeout` passes. Returns the answers, in order, as labels with
/// the answer's debug form (`failed: ...` for a request that got none).
pub fn probe(ns: &str, insider: Insider, timeout: Duration) -> Result<Vec<(String, String)>> {
    let netns = File::open(format!("/run/netns/{ns}"))
        .with_context(|| format!("no network namespace {ns}"))?;
    std::thread::spawn(move || {
        // SAFETY: setns on a namespace file we opened, for this thread only.
        if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            bail!("setns: {}", std::io::Error::last_os_error());
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            tokio::time::timeout(timeout, run(insider))
                .await
                .map_err(|_| anyhow!("not every request answered in {timeout:?}"))?
        })
    })
    .join()
    .map_err(|_| anyhow!("the insider's thread panicked"))?
}

fn fresh() -> [u8; PROOF_LEN] {
    let mut nonce = [0u8; PROOF_LEN];
    // A test's nonce: the OS generator, or a fixed one if it fails (the proof then only
    // fails to be fresh, which the agent does not check).
    let _ = getrandom::getrandom(&mut nonce);
    nonce
}

async fn run(insider: Insider) -> Result<Vec<(String, String)>> {
    let mut swarm = swarm(insider.identity.seed())?;
    let local = *swarm.local_peer_id();
    let mut proofs = Proofs::new(local);
    let _ = proofs.add_namespace(&insider.keys, Some(insider.credential), fresh);
    let tag = insider.keys.tag();
    swarm.dial(insider.target)?;
    let mut answers: Vec<Option<String>> = vec![None; insider.requests.len()];
    let mut pending = std::collections::HashMap::new();
    let mut requests = Some(insider.requests);
    let mut labels = Vec::new();
    loop {
        if answers.iter().all(Option::is_some) && requests.is_none() {
            break;
        }
        match swarm.select_next_some().await {
            SwarmEvent::Behaviour(HostileEvent::Proofs(request_response::Event::Message {
                peer,
                message:
                    Message::Request {
                        request, channel, ..
                    },
                ..
            })) => {
                let answer = match request {
                    ProofRequest::Challenge { nonce } => {
                        proofs.handle_challenge(peer, nonce, fresh)
                    }
                    ProofRequest::Proof { .. } => ProofResponse::Ack,
                };
                let _ = swarm.behaviour_mut().proofs.send_response(channel, answer);
                // Its proof is on the way: ask now (the agent holds requests from a peer
                // whose proof it awaits, and answers them once it has it).
                if let Some(list) = requests.take() {
                    for (i, (label, request)) in list.into_iter().enumerate() {
                        let id = swarm
                            .behaviour_mut()
                            .records
                            .send_request(&peer, ScopedRequest { ns: tag, request });
                        pending.insert(id, i);
                        labels.push(label);
                    }
                }
            }
            SwarmEvent::Behaviour(HostileEvent::Records(request_response::Event::Message {
                message:
                    Message::Response {
                        request_id,
                        response,
                    },
                ..
            })) => {
                if let Some(i) = pending.remove(&request_id) {
                    answers[i] = Some(describe(&response));
                }
            }
            SwarmEvent::Behaviour(HostileEvent::Records(
                request_response::Event::OutboundFailure {
                    request_id, error, ..
                },
            )) => {
                if let Some(i) = pending.remove(&request_id) {
                    answers[i] = Some(format!("failed: {error}"));
                }
            }
            SwarmEvent::OutgoingConnectionError { error, .. } => {
                bail!("cannot reach the agent: {error}")
            }
            _ => {}
        }
    }
    Ok(labels
        .into_iter()
        .zip(answers.into_iter().flatten())
        .collect())
}

/// An answer in short: its kind, and the reason of a refusal.
fn describe(response: &RecordResponse) -> String {
    match response {
        RecordResponse::Refused { reason } => format!("Refused({})", reason.as_str()),
        RecordResponse::Held { .. } => "Held".into(),
        RecordResponse::Value { envelope } => {
            format!(
                "Value({})",
                if envelope.is_some() { "some" } else { "none" }
            )
        }
        other => format!("{other:?}"),
    }
}

/// A claim of `key` by `identity`, with `plaintext` sealed under `keys` for an hour.
pub fn claim(
    keys: &NamespaceKeys,
    identity: &Identity,
    key: &hyphae_overlay::records::RecordKey,
    plaintext: &[u8],
) -> Result<RecordRequest> {
    let mut seed = [0u8; 32];
    getrandom::getrandom(&mut seed).map_err(|e| anyhow!("random number generator: {e}"))?;
    let mut rng: rand::rngs::StdRng = rand::SeedableRng::from_seed(seed);
    let expires = hyphae_overlay::swarm::unix_now() + 3600;
    let envelope =
        hyphae_overlay::records::Envelope::seal(keys, identity, key, expires, plaintext, &mut rng)
            .map_err(|e| anyhow!("{e}"))?;
    Ok(RecordRequest::Claim {
        key: key.to_vec(),
        envelope,
    })
}
