//! The retry budget of one pool: retries may add at most `budget_percent` % to the requests,
//! plus a floor of `min_budget` retries, so that retrying cannot multiply the load on a pool
//! that is already failing (Linkerd's retry budget: a ratio over a 10 s window plus a minimum).
//!
//! It is a token bucket counted in thousandths of a retry. Each request earns
//! `budget_percent / 100` of a retry; each retry spends one. Savings are capped at `min_budget`
//! plus `budget_percent` % of the requests of the last [`WINDOW`]: a pool serving 2,000
//! requests a second at 20 % may save up 4,000 retries, enough for every request in flight
//! on a backend that dies at once, while a steady failure still gets at most 20 % extra.
//!
//! The request path only adds one to one counter (every worker thread writes it: one line,
//! one atomic add); what a request earned, the balance and the cap are worked out from it when
//! a retry is asked for, which is rare.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How far back the requests that set the cap on savings are counted.
pub(crate) const WINDOW: Duration = Duration::from_secs(10);

/// One pool's retry budget.
#[derive(Debug)]
pub struct RetryBudget {
    /// Thousandths of a retry taken from what the requests earned: retries spent, and savings
    /// above the cap forgotten when a spend clamped them. The balance is `floor` plus
    /// `requests x per_request` minus this; it may exceed the cap until the next spend.
    debit: AtomicI64,
    /// Thousandths of a retry each request earns.
    per_request: i64,
    /// `min_budget`, in thousandths.
    floor: i64,
    /// Requests since the start.
    requests: AtomicU64,
    window: Mutex<Window>,
}

/// Where the current counting window began, and how many requests the last full one saw.
#[derive(Debug)]
struct Window {
    start: Instant,
    requests_at_start: u64,
    last_full: u64,
}

impl RetryBudget {
    /// A budget of `budget_percent` % of requests plus `min_budget` retries, starting with
    /// `min_budget` saved.
    pub(crate) fn new(budget_percent: u8, min_budget: u32) -> RetryBudget {
        RetryBudget::new_at(budget_percent, min_budget, Instant::now())
    }

    fn new_at(budget_percent: u8, min_budget: u32, now: Instant) -> RetryBudget {
        let floor = i64::from(min_budget) * 1000;
        RetryBudget {
            debit: AtomicI64::new(0),
            per_request: i64::from(budget_percent.min(100)) * 10,
            floor,
            requests: AtomicU64::new(0),
            window: Mutex::new(Window {
                start: now,
                requests_at_start: 0,
                last_full: 0,
            }),
        }
    }

    /// Counts one request towards the budget.
    pub fn on_request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Spends one retry if the budget has one.
    pub fn try_spend(&self) -> bool {
        self.try_spend_at(Instant::now())
    }

    fn try_spend_at(&self, now: Instant) -> bool {
        let cap = self.cap_at(now);
        // Requests counted meanwhile are left for the next spend: never more than was earned.
        let earned = self.earned(self.requests.load(Ordering::Relaxed));
        self.debit
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |debit| {
                let t = earned.saturating_sub(debit).min(cap);
                (t >= 1000).then_some(earned - (t - 1000))
            })
            .is_ok()
    }

    /// `min_budget` plus what `requests` requests earned, in thousandths.
    fn earned(&self, requests: u64) -> i64 {
        let share = i64::try_from(requests)
            .unwrap_or(i64::MAX)
            .saturating_mul(self.per_request);
        self.floor.saturating_add(share)
    }

    /// `min_budget` plus the share of the requests of about the last [`WINDOW`].
    fn cap_at(&self, now: Instant) -> i64 {
        let total = self.requests.load(Ordering::Relaxed);
        let mut window = crate::lockstat::lock(&self.window, crate::lockstat::Site::Budget);
        let elapsed = now.saturating_duration_since(window.start);
        if elapsed >= WINDOW {
            // Scaled to one window, in case no retry was asked for over several.
            let seen = total.saturating_sub(window.requests_at_start);
            window.last_full = (u128::from(seen) * WINDOW.as_millis() / elapsed.as_millis().max(1))
                .min(u128::from(u64::MAX)) as u64;
            window.start = now;
            window.requests_at_start = total;
        }
        let recent = window
            .last_full
            .max(total.saturating_sub(window.requests_at_start));
        let earned = i64::try_from(recent)
            .unwrap_or(i64::MAX)
            .saturating_mul(self.per_request);
        self.floor.saturating_add(earned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spend_all(budget: &RetryBudget, now: Instant) -> usize {
        (0..100_000)
            .take_while(|_| budget.try_spend_at(now))
            .count()
    }

    #[test]
    fn without_a_share_only_the_floor_is_spent() {
        let budget = RetryBudget::new(0, 2);
        for _ in 0..1000 {
            budget.on_request();
        }
        assert_eq!(spend_all(&budget, Instant::now()), 2);
    }

    #[test]
    fn a_busy_pool_saves_enough_for_a_burst_of_failures() {
        // 2,000 requests at 20 %: 10 + 400 retries saved, all spendable at once.
        let budget = RetryBudget::new(20, 10);
        for _ in 0..2000 {
            budget.on_request();
        }
        assert_eq!(spend_all(&budget, Instant::now()), 410);
        // Then each retry has to be earned by five requests.
        for _ in 0..50 {
            budget.on_request();
        }
        assert_eq!(spend_all(&budget, Instant::now()), 10);
    }

    #[test]
    fn savings_are_capped_by_the_requests_of_the_last_window() {
        let start = Instant::now();
        let budget = RetryBudget::new_at(20, 10, start);
        for _ in 0..10_000 {
            budget.on_request();
        }
        // One spend at the start of a quiet stretch closes the busy window...
        assert!(budget.try_spend_at(start + WINDOW));
        // ...and three windows later, with only 100 requests since, the 2,000 saved retries
        // are capped at 10 + 20 % of the requests the windows saw on average.
        for _ in 0..100 {
            budget.on_request();
        }
        let later = start + WINDOW * 4;
        assert_eq!(spend_all(&budget, later), 10 + 100 * 20 / 100 / 3);
    }
}
