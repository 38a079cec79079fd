//! Messages between members of one namespace (a migration handoff's request, reply and
//! `Moved` push between router sites): opaque bodies on request-response
//! (`/hyphae/routers/1`), delivered only from a peer that proved it is a member of the
//! message's namespace. The answer says only whether the message was taken; a reply of the
//! receiver's own is a message of its own, so nothing waits on a stream meanwhile.

use std::time::Instant;

use libp2p::request_response;
use serde::{Deserialize, Serialize};

use super::{NetworkId, Overlay, OverlayEvent};
use crate::proof::NamespaceTag;

/// The protocol name.
pub const ROUTERS_PROTOCOL: &str = "/hyphae/routers/1";

/// The largest body taken: a handoff's messages carry one sealed record at most.
pub const MAX_ROUTER_MESSAGE: usize = 4096;

/// A message to a member, scoped to one namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouterMessage {
    /// The namespace's tag.
    pub ns: NamespaceTag,
    /// What the member's agent reads.
    pub body: Vec<u8>,
}

/// Whether the receiver took the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RouterAck {
    /// Delivered to the receiver's agent.
    Taken,
    /// Refused: the sender is not (yet) a proven member of the namespace, the receiver is
    /// not one, or the body is over [`MAX_ROUTER_MESSAGE`].
    Refused,
}

impl Overlay {
    /// Sends `body` to the member `to` in namespace `ns`. Returns false (nothing sent) for
    /// a body over [`MAX_ROUTER_MESSAGE`]. Delivery is not confirmed to the caller: a lost
    /// message is the protocol's to repeat (a handoff retries its request).
    pub fn send_to_member(&mut self, ns: NamespaceTag, to: NetworkId, body: Vec<u8>) -> bool {
        if body.len() > MAX_ROUTER_MESSAGE {
            return false;
        }
        self.swarm
            .behaviour_mut()
            .routers
            .send_request(&to, RouterMessage { ns, body });
        true
    }

    pub(super) fn handle_routers(
        &mut self,
        _now: Instant,
        event: request_response::Event<RouterMessage, RouterAck>,
    ) {
        match event {
            request_response::Event::Message {
                peer,
                message:
                    request_response::Message::Request {
                        request, channel, ..
                    },
                ..
            } => {
                let taken = self.proofs.is_member(&peer, &request.ns)
                    && request.body.len() <= MAX_ROUTER_MESSAGE;
                let ack = if taken {
                    self.events.push_back(OverlayEvent::MemberMessage {
                        ns: request.ns,
                        from: peer,
                        body: request.body,
                    });
                    RouterAck::Taken
                } else {
                    self.stats.router_messages_refused += 1;
                    tracing::debug!(%peer, "message from a peer not proven a member: refused");
                    RouterAck::Refused
                };
                let _ = self
                    .swarm
                    .behaviour_mut()
                    .routers
                    .send_response(channel, ack);
            }
            request_response::Event::OutboundFailure { peer, error, .. } => {
                self.stats.router_messages_failed += 1;
                tracing::debug!(%peer, %error, "message to a member failed");
            }
            request_response::Event::Message {
                peer,
                message:
                    request_response::Message::Response {
                        response: RouterAck::Refused,
                        ..
                    },
                ..
            } => {
                self.stats.router_messages_failed += 1;
                tracing::debug!(%peer, "message refused by the member");
            }
            _ => {}
        }
    }
}
