//! Every problem of a configuration, not only the first.
//!
//! Validation goes on past a bad value where the rest of the file can still be judged on its
//! own (a bad duration gets its default as a placeholder, a pool or listener that failed is
//! left out of what follows it), so that `capataz check` lists every error in one run. The
//! single-error API ([`ConfigError`]) stays: it is the first of them, the one a reader of the
//! file would meet first in validation order.

use std::fmt;

use super::ConfigError;

/// The errors of one configuration, in the order validation met them; never empty.
#[derive(Debug)]
pub struct ConfigErrors {
    first: ConfigError,
    more: Vec<ConfigError>,
}

impl ConfigErrors {
    /// Wraps `errors`; `None` when there are none.
    pub(super) fn from_vec(errors: Vec<ConfigError>) -> Option<ConfigErrors> {
        let mut errors = errors.into_iter();
        let first = errors.next()?;
        Some(ConfigErrors {
            first,
            more: errors.collect(),
        })
    }

    /// The first error, as the single-error API reports it.
    pub fn first(&self) -> &ConfigError {
        &self.first
    }

    /// The first error, dropping the others.
    pub fn into_first(self) -> ConfigError {
        self.first
    }

    /// How many errors there are (at least one).
    #[allow(clippy::len_without_is_empty)] // Never empty.
    pub fn len(&self) -> usize {
        1 + self.more.len()
    }

    /// Every error, the first one first.
    pub fn iter(&self) -> impl Iterator<Item = &ConfigError> {
        std::iter::once(&self.first).chain(&self.more)
    }
}

impl From<ConfigError> for ConfigErrors {
    fn from(first: ConfigError) -> ConfigErrors {
        ConfigErrors {
            first,
            more: Vec::new(),
        }
    }
}

impl From<ConfigErrors> for ConfigError {
    fn from(errors: ConfigErrors) -> ConfigError {
        errors.first
    }
}

/// One error per line.
impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, error) in self.iter().enumerate() {
            if index > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}
