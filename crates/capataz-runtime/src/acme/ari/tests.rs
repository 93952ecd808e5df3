//! The ARI schedule on simulated time: Unix seconds and random draws given, never read.

use super::*;

const DAY: i64 = 86_400;

fn window(start: i64, end: i64, retry_after: u64) -> Answer {
    Answer::Window {
        start,
        end,
        retry_after: Duration::from_secs(retry_after),
    }
}

fn fresh() -> Ari {
    Ari {
        id: Some(
            CertificateIdentifier::new(Der::from(&[1u8][..]), Der::from(&[2u8][..])).into_owned(),
        ),
        state: State::Unknown,
        replaces_refused: false,
    }
}

#[test]
fn the_renewal_time_is_uniform_in_a_window_not_started() {
    let now = 1_000 * DAY;
    let (start, end) = (now + 10 * DAY, now + 12 * DAY);
    assert_eq!(choose(start, end, now, 0.0), start);
    assert_eq!(choose(start, end, now, 0.5), start + DAY);
    assert!(choose(start, end, now, 0.999_999) <= end);
    // Out-of-range draws stay in the window.
    assert_eq!(choose(start, end, now, 7.0), end);
    assert_eq!(choose(start, end, now, -1.0), start);
}

#[test]
fn a_window_already_started_or_past_renews_at_once() {
    let now = 1_000 * DAY;
    assert_eq!(choose(now - DAY, now + DAY, now, 0.9), now);
    assert_eq!(choose(now - 3 * DAY, now - 2 * DAY, now, 0.9), now);
    assert_eq!(choose(now, now + DAY, now, 0.9), now);
}

#[test]
fn retry_after_is_bounded_to_a_minute_and_a_day() {
    assert_eq!(ask_again(Duration::ZERO), MIN_ASK_AGAIN);
    assert_eq!(ask_again(Duration::from_secs(59)), Duration::from_secs(60));
    assert_eq!(
        ask_again(Duration::from_secs(6 * 3600)),
        Duration::from_secs(6 * 3600)
    );
    assert_eq!(
        ask_again(Duration::from_secs(400 * 86_400)),
        Duration::from_secs(86_400)
    );
}

#[test]
fn the_same_window_keeps_its_renewal_time_and_another_is_chosen_again() {
    let now = 1_000 * DAY;
    let mut ari = fresh();
    assert_eq!(ari.ask_at(), Some(i64::MIN));
    assert_eq!(ari.renew_at(), None);
    ari.answered(window(now + DAY, now + 3 * DAY, 3600), now, 0.25);
    assert_eq!(ari.renew_at(), Some(now + DAY + DAY / 2));
    assert_eq!(ari.ask_at(), Some(now + 3600));
    assert!(ari.replaces().is_some());
    // Asked again an hour later: the same window, a different draw, the same time.
    ari.answered(window(now + DAY, now + 3 * DAY, 7200), now + 3600, 0.9);
    assert_eq!(ari.renew_at(), Some(now + DAY + DAY / 2));
    assert_eq!(ari.ask_at(), Some(now + 3600 + 7200));
    // The CA moves the window into the past (a revocation): at once.
    ari.answered(window(now - DAY, now, 7200), now + 7200, 0.9);
    assert_eq!(ari.renew_at(), Some(now + 7200));
}

#[test]
fn a_failed_query_keeps_the_window_followed_and_asks_again_in_an_hour() {
    let now = 1_000 * DAY;
    let mut ari = fresh();
    ari.answered(Answer::Failed, now, 0.5);
    assert_eq!(ari.renew_at(), None);
    assert_eq!(ari.ask_at(), Some(now + 3600));
    // The CA down from the start: whether it offers ARI is unknown, no `replaces`.
    assert!(ari.replaces().is_none());
    ari.answered(window(now + DAY, now + 2 * DAY, 60), now, 0.0);
    ari.answered(Answer::Failed, now + 60, 0.5);
    assert_eq!(ari.renew_at(), Some(now + DAY));
    assert!(ari.replaces().is_some());
    assert_eq!(ari.ask_at(), Some(now + 60 + 3600));
    // A window that ends before it starts is a failed answer, asked again after Retry-After.
    ari.answered(window(now + 5 * DAY, now + 4 * DAY, 120), now + 120, 0.5);
    assert_eq!(ari.renew_at(), Some(now + DAY));
    assert_eq!(ari.ask_at(), Some(now + 240));
}

#[test]
fn a_directory_without_renewal_info_is_not_asked_again() {
    let mut ari = fresh();
    ari.answered(Answer::Unsupported, 0, 0.5);
    assert_eq!(ari.ask_at(), None);
    assert_eq!(ari.renew_at(), None);
    assert!(ari.replaces().is_none());
}

#[test]
fn an_order_naming_the_certificate_that_failed_is_not_named_again() {
    let mut ari = fresh();
    assert!(ari.replaces().is_none(), "not before the CA answered");
    ari.answered(window(DAY, 2 * DAY, 60), 0, 0.5);
    assert_eq!(ari.replaces(), ari.id);
    ari.replaces_refused = true;
    assert!(ari.replaces().is_none());
}
