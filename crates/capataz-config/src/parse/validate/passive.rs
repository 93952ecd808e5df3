//! `[pools.NAME.passive]`: what real traffic counts against a backend (consecutive errors,
//! 503s, gRPC codes), how long an ejection lasts, and the success-rate, load-shedding and
//! latency-outlier tables. Called from the pool's validation (`pool.rs`).

use std::num::NonZeroU32;
use std::time::Duration;

use capataz_health::{GrpcCodes, Percentile};
use toml::{Spanned, Value};

use super::super::raw::{RawLatencyOutliers, RawLoadShedding, RawPassive, RawSuccessRate};
use super::{ConfigError, Validator};
use crate::{LatencyOutliersConfig, LoadSheddingConfig, PassiveCheckConfig, SuccessRateConfig};

impl Validator<'_> {
    pub(super) fn passive(
        &self,
        at: &str,
        raw: RawPassive,
    ) -> Result<PassiveCheckConfig, ConfigError> {
        let errors_before = self.error_count();
        let ejection_key = format!("{at}.ejection_time");
        let max_key = format!("{at}.max_ejection_time");
        let ejection_time =
            self.duration(&raw.ejection_time, &ejection_key, Duration::from_secs(30))?;
        let max_ejection_time =
            self.duration(&raw.max_ejection_time, &max_key, Duration::from_secs(300))?;
        // Compared only when both were read without error (not placeholders).
        if max_ejection_time < ejection_time && self.error_count() == errors_before {
            // Point at the key that was written; max_ejection_time when both were.
            // (The defaults are ordered, so at least one of them was written.)
            let (span, key) = match (&raw.max_ejection_time, &raw.ejection_time) {
                (Some(max), _) => (Some(max.span()), &max_key),
                (None, Some(base)) => (Some(base.span()), &ejection_key),
                (None, None) => (None, &max_key),
            };
            return Err(self.error(
                span,
                key,
                format!(
                    "max_ejection_time {max_ejection_time:?} is shorter than ejection_time \
                     {ejection_time:?} (make max_ejection_time at least ejection_time)"
                ),
            ));
        }
        Ok(PassiveCheckConfig {
            enabled: raw.enabled.unwrap_or(true),
            consecutive_errors: self.threshold(
                &raw.consecutive_errors,
                &format!("{at}.consecutive_errors"),
                3,
            )?,
            count_503: raw.count_503.unwrap_or(true),
            ejection_time,
            max_ejection_time,
            max_ejected_percent: self.int(
                &raw.max_ejected_percent,
                &format!("{at}.max_ejected_percent"),
                50,
                0..=100,
            )? as u8,
            probes_end_ejection: raw.probes_end_ejection.unwrap_or(true),
            grpc_error_codes: self
                .grpc_codes(&raw.grpc_error_codes, &format!("{at}.grpc_error_codes"))?,
            latency_outliers: match raw.latency_outliers {
                Some(raw) => self.latency_outliers(&format!("{at}.latency_outliers"), raw)?,
                None => None,
            },
            load_shedding: match raw.load_shedding {
                Some(raw) => self.load_shedding(&format!("{at}.load_shedding"), raw)?,
                None => None,
            },
            success_rate: match raw.success_rate {
                Some(raw) => self.success_rate(&format!("{at}.success_rate"), raw)?,
                None => None,
            },
        })
    }

    /// `[pools.NAME.passive.success_rate]`: checked whole even when not enabled.
    fn success_rate(
        &self,
        at: &str,
        raw: RawSuccessRate,
    ) -> Result<Option<SuccessRateConfig>, ConfigError> {
        let stdev_factor_milli = match &raw.stdev_factor {
            None => 1900,
            Some(value) => {
                let n = match value.get_ref() {
                    Value::Float(f) => Some(*f),
                    Value::Integer(i) => Some(*i as f64),
                    _ => None,
                };
                match n {
                    Some(n) if (0.1..=10.0).contains(&n) => (n * 1000.0).round() as u32,
                    _ => {
                        return Err(self.error(
                            Some(value.span()),
                            &format!("{at}.stdev_factor"),
                            format!(
                                "{} is not a factor from 0.1 to 10 (use a number such as 1.9, \
                                 Envoy's default)",
                                value.get_ref()
                            ),
                        ))
                    }
                }
            }
        };
        let config = SuccessRateConfig {
            window: self.duration(
                &raw.window,
                &format!("{at}.window"),
                Duration::from_secs(10),
            )?,
            min_requests: self.int(
                &raw.min_requests,
                &format!("{at}.min_requests"),
                100,
                1..=1_000_000,
            )? as u32,
            min_backends: self.int(
                &raw.min_backends,
                &format!("{at}.min_backends"),
                5,
                2..=100_000,
            )? as u32,
            stdev_factor_milli,
        };
        Ok(raw.enabled.unwrap_or(false).then_some(config))
    }

    /// `[pools.NAME.passive.load_shedding]`: checked whole even when not enabled.
    fn load_shedding(
        &self,
        at: &str,
        raw: RawLoadShedding,
    ) -> Result<Option<LoadSheddingConfig>, ConfigError> {
        let config = LoadSheddingConfig {
            weight_percent: self.int(
                &raw.weight_percent,
                &format!("{at}.weight_percent"),
                10,
                1..=100,
            )? as u8,
            max_retry_after: self.duration(
                &raw.max_retry_after,
                &format!("{at}.max_retry_after"),
                Duration::from_secs(300),
            )?,
            default_retry_after: self.duration(
                &raw.default_retry_after,
                &format!("{at}.default_retry_after"),
                Duration::from_secs(1),
            )?,
        };
        Ok(raw.enabled.unwrap_or(false).then_some(config))
    }

    /// `[pools.NAME.passive.latency_outliers]`: checked whole even when not enabled.
    fn latency_outliers(
        &self,
        at: &str,
        raw: RawLatencyOutliers,
    ) -> Result<Option<LatencyOutliersConfig>, ConfigError> {
        let percentile = match &raw.percentile {
            None => Percentile::P99,
            Some(text) => match text.get_ref().as_str() {
                "p50" => Percentile::P50,
                "p99" => Percentile::P99,
                other => {
                    return Err(self.error(
                        Some(text.span()),
                        &format!("{at}.percentile"),
                        format!("{other:?} is not a percentile (use \"p50\" or \"p99\")"),
                    ))
                }
            },
        };
        let config = LatencyOutliersConfig {
            percentile,
            factor: NonZeroU32::new(
                self.int(&raw.factor, &format!("{at}.factor"), 3, 2..=1000)? as u32
            )
            .unwrap_or(NonZeroU32::MIN),
            windows: NonZeroU32::new(
                self.int(&raw.windows, &format!("{at}.windows"), 3, 1..=100)? as u32,
            )
            .unwrap_or(NonZeroU32::MIN),
            window: self.duration(
                &raw.window,
                &format!("{at}.window"),
                Duration::from_secs(10),
            )?,
            min_requests: self.int(
                &raw.min_requests,
                &format!("{at}.min_requests"),
                20,
                1..=1_000_000,
            )? as u32,
            min_latency: self.duration(
                &raw.min_latency,
                &format!("{at}.min_latency"),
                Duration::from_millis(5),
            )?,
        };
        Ok(raw.enabled.unwrap_or(false).then_some(config))
    }

    /// A list of gRPC status codes, each 1-16; the default set when absent.
    fn grpc_codes(
        &self,
        value: &Option<Spanned<Vec<Spanned<i64>>>>,
        key: &str,
    ) -> Result<GrpcCodes, ConfigError> {
        let Some(list) = value else {
            return Ok(GrpcCodes::DEFAULT_ERRORS);
        };
        let mut codes = Vec::with_capacity(list.get_ref().len());
        for code in list.get_ref() {
            let n = *code.get_ref();
            if !(1..=16).contains(&n) {
                return Err(self.error(
                    Some(code.span()),
                    key,
                    format!(
                        "{n} is not a gRPC error code (use codes 1-16, e.g. [14, 4, 13, 2] for \
                         UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, UNKNOWN; [] counts none)"
                    ),
                ));
            }
            // 1..=16 fits in a u8.
            codes.push(n as u8);
        }
        Ok(GrpcCodes::of(codes))
    }
}
