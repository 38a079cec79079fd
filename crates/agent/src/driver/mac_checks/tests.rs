#![allow(clippy::disallowed_methods)] // tests start the clock from a real instant

use super::*;

const M: Mac = [2, 0, 0, 0, 0, 0xa];
const N: Mac = [2, 0, 0, 0, 0, 0xb];
/// Members: their identity, and their tunnel's handle.
const A: (u8, u32) = (1, 10);
const S: (u8, u32) = (2, 20);

fn change(peer: (u8, u32), mac: Mac, refused: bool) -> Change<u32> {
    Change {
        peer: peer.1,
        mac,
        refused,
    }
}

#[test]
fn a_mac_its_announcer_holds_is_read_once_and_kept() {
    let t0 = Instant::now();
    let mut c = MacChecks::<u8, u32>::default();
    assert!(c.announced(t0, A, &[M, N]).is_empty());
    let mut due = c.due(t0);
    due.sort_unstable();
    assert_eq!(due, vec![M, N]);
    assert!(c.due(t0).is_empty(), "a read is out for each");
    assert!(c.holder(t0, M, Some(A.0)).is_empty());
    assert!(c.holder(t0, N, Some(A.0)).is_empty());
    assert_eq!(c.counts().verified, 2);
    assert_eq!(c.poll_timeout(), Some(t0 + HELD_RECHECK));
    assert!(c.due(t0 + Duration::from_secs(60)).is_empty());
}

#[test]
fn another_members_mac_is_refused_after_the_grace_and_allowed_once_its_lease_moves() {
    let t0 = Instant::now();
    let mut c = MacChecks::<u8, u32>::default();
    c.announced(t0, A, &[M]);
    c.announced(t0, S, &[M]);
    assert_eq!(c.due(t0), vec![M], "one read for both announcers");
    // A holds it: S is within its grace (a host moving there), A is verified.
    assert!(c.holder(t0, M, Some(A.0)).is_empty());
    let mut t = t0;
    let mut changes = Vec::new();
    while changes.is_empty() {
        t += RECHECK;
        assert!(t <= t0 + GRACE + RECHECK, "never refused");
        assert_eq!(c.due(t), vec![M]);
        changes = c.holder(t, M, Some(A.0));
    }
    assert_eq!(changes, vec![change(S, M, true)]);
    assert!(t - t0 >= GRACE);
    assert_eq!(c.counts().refused, 1);
    // Announcing it again gets no new grace: refused at once.
    c.announced(t, S, &[]);
    assert_eq!(c.announced(t, S, &[M]), vec![change(S, M, true)]);
    // The lease moves to S (the host did move there): allowed again, A's claim is not.
    t += REFUSED_RECHECK;
    assert_eq!(c.due(t), vec![M]);
    assert_eq!(c.holder(t, M, Some(S.0)), vec![change(S, M, false)]);
    assert_eq!(c.counts().refusals, 1);
    // A, still announcing it GRACE later, is refused in turn.
    let later = t + GRACE;
    let _ = c.due(later);
    assert_eq!(c.holder(later, M, Some(S.0)), vec![change(A, M, true)]);
}

#[test]
fn a_mac_nobody_holds_is_allowed_for_the_grace_only() {
    let t0 = Instant::now();
    let mut c = MacChecks::<u8, u32>::default();
    c.announced(t0, S, &[M]);
    c.due(t0);
    assert!(c.holder(t0, M, None).is_empty());
    let t = t0 + GRACE;
    assert_eq!(c.due(t), vec![M]);
    assert_eq!(c.holder(t, M, None), vec![change(S, M, true)]);
}

#[test]
fn reads_are_bounded_and_a_lost_read_is_made_again() {
    let t0 = Instant::now();
    let mut c = MacChecks::<u8, u32>::default();
    let many: Vec<Mac> = (0..200u8).map(|i| [2, 0, 0, 0, 1, i]).collect();
    c.announced(t0, A, &many);
    assert_eq!(c.due(t0).len(), MAX_READS);
    assert!(c.due(t0).is_empty());
    // None answered: after the timeout they are read again, with the rest.
    let t = t0 + READ_TIMEOUT;
    assert_eq!(c.poll_timeout(), Some(t0), "the others wait for room");
    assert_eq!(c.due(t).len(), MAX_READS);
}

#[test]
fn a_member_gone_takes_its_allowed_macs_but_not_its_refusals() {
    let t0 = Instant::now();
    let mut c = MacChecks::<u8, u32>::default();
    c.announced(t0, S, &[M, N]);
    c.due(t0);
    c.holder(t0, N, Some(S.0));
    c.holder(t0, M, Some(A.0));
    let t = t0 + GRACE;
    c.due(t);
    assert_eq!(c.holder(t, M, Some(A.0)), vec![change(S, M, true)]);
    c.forget(t, S.0);
    assert_eq!(
        c.counts(),
        MacCheckCounts {
            verified: 0,
            refused: 0,
            refusals: 1
        }
    );
    // Back with a new tunnel: M is refused at once, N is read again.
    assert_eq!(
        c.announced(t, (S.0, 21), &[M, N]),
        vec![Change {
            peer: 21,
            mac: M,
            refused: true
        }]
    );
    assert_eq!(c.due(t), vec![N]);
}
