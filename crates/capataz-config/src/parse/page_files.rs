//! Stage three, for error pages: the files of `[listeners.error_pages]`, read where names are
//! resolved (before the runtime, in `capataz check`, on the blocking pool during a reload,
//! which reads them again), never on a runtime thread. A page is at most
//! [`MAX_ERROR_PAGE_BYTES`] (more is an error, so a path to an endless stream cannot fill
//! memory); an unreadable or oversized file is a [`ConfigError`] naming it, the line and the
//! key, and the whole config is refused (a reload then changes nothing).

use std::io::Read as _;
use std::path::PathBuf;

use super::ConfigError;
use crate::{Config, MAX_ERROR_PAGE_BYTES};

/// A page file to read, and where it goes.
#[derive(Clone, Debug)]
pub(super) struct PageLoad {
    /// The listener's index in the config.
    pub(super) listener: usize,
    /// The status whose page it is.
    pub(super) status: u16,
    /// The file, joined to the config file's directory when relative.
    pub(super) path: PathBuf,
    /// Where it was named, for errors.
    pub(super) file: String,
    pub(super) line: Option<usize>,
    pub(super) key: String,
}

impl PageLoad {
    fn error(&self, message: String) -> ConfigError {
        ConfigError::Invalid {
            file: self.file.clone(),
            line: self.line,
            key: self.key.clone(),
            message: format!("{}: {message}", self.path.display()),
        }
    }

    fn read(&self) -> Result<Vec<u8>, ConfigError> {
        let limit = MAX_ERROR_PAGE_BYTES as u64;
        let mut bytes = Vec::new();
        std::fs::File::open(&self.path)
            .and_then(|file| file.take(limit + 1).read_to_end(&mut bytes))
            .map_err(|error| {
                self.error(format!(
                    "cannot read the error page: {error} (check the path and its permissions)"
                ))
            })?;
        if bytes.len() > MAX_ERROR_PAGE_BYTES {
            return Err(self.error(format!(
                "the file is larger than {} KiB, the most an error page may be (shorten it)",
                MAX_ERROR_PAGE_BYTES >> 10
            )));
        }
        Ok(bytes)
    }
}

/// Reads every page file into `config`; every failure is returned, in order.
pub(super) fn load_all(config: &mut Config, loads: &[PageLoad]) -> Vec<ConfigError> {
    let mut errors = Vec::new();
    for load in loads {
        match load.read() {
            Ok(body) => {
                let page = config
                    .listeners
                    .get_mut(load.listener)
                    .and_then(|listener| listener.error_pages.as_mut())
                    .and_then(|pages| pages.pages.iter_mut().find(|p| p.status == load.status));
                if let Some(page) = page {
                    page.body = body;
                }
            }
            Err(error) => errors.push(error),
        }
    }
    errors
}
