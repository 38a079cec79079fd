#![allow(clippy::disallowed_methods)] // tests start the clock from a real instant

use super::*;

const M: Mac = [2, 0, 0, 0, 0, 0xa];
const N: Mac = [2, 0, 0, 0, 0, 0xb];
/// Members, by identity.
const A: u8 = 1;
const S: u8 = 2;

fn change(peer: u8, mac: Mac, refused: bool) -> Change<u8> {
    Change { peer, mac, refused }
}

#[test]
fn a_mac_its_announcer_holds_is_read_once_and_kept() {
    let t0 = Instant::now();
    let mut c = MacChecks::<u8>::default();
    assert!(c.announced(t0, A, &[M, N]).is_empty());
    let mut due = c.due(t0);
    due.sort_unstable();
    assert_eq!(due, vec![M, N]);
    assert!(c.due(t0).is_empty(), "a read is out for each");
    assert!(c.holder(t0, M, Some(A)).is_empty());
    assert!(c.holder(t0, N, Some(A)).is_empty());
    assert_eq!(c.counts().verified, 2);
    assert_eq!(c.poll_timeout(), Some(t0 + HELD_RECHECK));
    assert!(c.due(t0 + Duration::from_secs(60)).is_empty());
}

#[test]
fn another_members_mac_is_refused_after_the_grace_and_allowed_once_its_lease_moves() {
    let t0 = Instant::now();
    let mut c = MacChecks::<u8>::default();
    c.announced(t0, A, &[M]);
    c.announced(t0, S, &[M]);
    assert_eq!(c.due(t0), vec![M], "one read for both announcers");
    // A holds it: S is within its grace (a host moving there), A is verified.
    assert!(c.holder(t0, M, Some(A)).is_empty());
    let mut t = t0;
    let mut changes = Vec::new();
    while changes.is_empty() {
        t += RECHECK;
        assert!(t <= t0 + GRACE + RECHECK, "never refused");
        assert_eq!(c.due(t), vec![M]);
        changes = c.holder(t, M, Some(A));
    }
    assert_eq!(changes, vec![change(S, M, true)]);
    assert!(t - t0 >= GRACE);
    assert_eq!(c.counts().refused, 1);
    // Announcing it again gets no new grace: refused at once.
    c.announced(t, S, &[]);
    assert_eq!(c.announced(t, S, &[M]), vec![change(S, M, true)]);
    // The lease moves to S (the host did move there): allowed again, A's claim is not.
    t += SLOW_RECHECK;
    assert_eq!(c.due(t), vec![M]);
    assert_eq!(c.holder(t, M, Some(S)), vec![change(S, M, false)]);
    assert_eq!(c.counts().refusals, 1);
    // A, still announcing it GRACE later, is refused in turn.
    let later = t + GRACE;
    let _ = c.due(later);
    assert_eq!(c.holder(later, M, Some(S)), vec![change(A, M, true)]);
}

#[test]
fn a_mac_nobody_holds_is_not_refused_and_a_refusal_stands_until_the_lease_is_the_members() {
    let t0 = Instant::now();
    let mut c = MacChecks::<u8>::default();
    c.announced(t0, S, &[M]);
    c.due(t0);
    // No record (a claim still out, or no replica answered): read again, never refused.
    for k in 0..5 {
        let t = t0 + SLOW_RECHECK * k;
        let _ = c.due(t);
        assert!(c.holder(t, M, None).is_empty());
    }
    assert_eq!(c.counts().refused, 0);
    // Refused once another held it; the holder lets it go: still refused until S holds it.
    let t = t0 + SLOW_RECHECK * 5;
    c.due(t);
    c.holder(t, M, Some(A));
    let t = t + GRACE;
    c.due(t);
    assert_eq!(c.holder(t, M, Some(A)), vec![change(S, M, true)]);
    let t = t + SLOW_RECHECK;
    c.due(t);
    assert!(c.holder(t, M, None).is_empty());
    assert_eq!(c.counts().refused, 1);
    let t = t + SLOW_RECHECK;
    c.due(t);
    assert_eq!(c.holder(t, M, Some(S)), vec![change(S, M, false)]);
}

#[test]
fn reads_are_bounded_a_full_table_waits_for_answers_and_a_lost_read_is_made_again() {
    let t0 = Instant::now();
    let mut c = MacChecks::<u8>::default();
    let many: Vec<Mac> = (0..200u8).map(|i| [2, 0, 0, 0, 1, i]).collect();
    c.announced(t0, A, &many);
    assert_eq!(c.due(t0).len(), MAX_READS);
    assert!(c.due(t0).is_empty());
    // The others wait for room: no deadline in the past while the reads are out.
    assert_eq!(c.poll_timeout(), Some(t0 + READ_TIMEOUT));
    // One answer makes room for one more.
    let answered = many
        .iter()
        .find(|m| c.reading.contains_key(*m))
        .copied()
        .unwrap();
    c.holder(t0, answered, Some(A));
    assert_eq!(c.poll_timeout(), Some(t0));
    assert_eq!(c.due(t0).len(), 1);
    // None of the rest answered: after the timeout they are read again.
    let t = t0 + READ_TIMEOUT;
    assert_eq!(c.due(t).len(), MAX_READS);
}

#[test]
fn a_member_gone_takes_its_allowed_macs_but_not_its_refusals() {
    let t0 = Instant::now();
    let mut c = MacChecks::<u8>::default();
    c.announced(t0, S, &[M, N]);
    c.due(t0);
    c.holder(t0, N, Some(S));
    c.holder(t0, M, Some(A));
    let t = t0 + GRACE;
    c.due(t);
    assert_eq!(c.holder(t, M, Some(A)), vec![change(S, M, true)]);
    c.forget(t, S);
    assert_eq!(
        c.counts(),
        MacCheckCounts {
            verified: 0,
            refused: 0,
            refusals: 1
        }
    );
    // Back: M is refused at once, N is read again.
    assert_eq!(c.announced(t, S, &[M, N]), vec![change(S, M, true)]);
    assert_eq!(c.due(t), vec![N]);
}
