//! The ACME storage directory: the account's credentials and the certificate with its key,
//! each written to a temporary file and renamed into place (a reader sees the old file or the
//! new one, never half of one), the keys with mode 0600. Blocking: run on the blocking pool.

use std::io::Write as _;
use std::path::Path;

/// The largest account file read: 64 KiB (it is a few hundred bytes).
const MAX_ACCOUNT_BYTES: u64 = 64 << 10;

/// Writes `bytes` to `path` atomically; `secret` files get mode 0600.
pub(super) fn write_atomic(path: &Path, bytes: &[u8], secret: bool) -> std::io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("the path has no directory"))?;
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temporary = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(if secret { 0o600 } else { 0o644 });
    }
    let written = options.open(&temporary).and_then(|mut file| {
        file.write_all(bytes)?;
        file.sync_all()
    });
    if let Err(error) = written.and_then(|()| std::fs::rename(&temporary, path)) {
        let _ = std::fs::remove_file(&temporary);
        return Err(error);
    }
    Ok(())
}

/// The account file's bytes, if it exists (bounded).
pub(super) fn read_account(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read as _;
    match std::fs::File::open(path) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
        Ok(file) => {
            let mut bytes = Vec::new();
            file.take(MAX_ACCOUNT_BYTES).read_to_end(&mut bytes)?;
            Ok(Some(bytes))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_written_whole_with_mode_0600() {
        let dir = std::env::temp_dir().join(format!("capataz-acme-store-{}", std::process::id()));
        let path = dir.join("sub").join("key.pem");
        write_atomic(&path, b"one", true).expect("written");
        write_atomic(&path, b"two", true).expect("rewritten");
        assert_eq!(std::fs::read(&path).expect("read"), b"two");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
