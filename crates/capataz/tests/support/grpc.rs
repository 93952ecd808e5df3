//! The Python gRPC peers of the gRPC tests (`tests/support/grpc/server.py` and `client.py`,
//! on grpcio), run by one interpreter chosen here, not by whichever `python3` comes first on
//! PATH: Debian's own, `/usr/bin/python3`, where `.ci/deps/grpcio.sh` installs grpcio (the
//! `python3-grpcio` package). `CAPATAZ_TEST_PYTHON` names another interpreter that has grpcio.

use std::process::Command;

/// The interpreter the gRPC peers run on.
pub fn python() -> String {
    std::env::var("CAPATAZ_TEST_PYTHON").unwrap_or_else(|_| "/usr/bin/python3".to_owned())
}

/// A command running `script` (a file of `tests/support/grpc/`) on [`python`].
pub fn peer(script: &str) -> Command {
    if std::env::var_os("CAPATAZ_TEST_PYTHON").is_none() {
        // Debian's Python, which .ci/deps/grpcio.sh gives grpcio (and the tier rule of
        // `require_tool`: a gRPC peer is a real peer).
        super::tools::require_tool("python3", "grpcio");
    }
    let mut command = Command::new(python());
    command.arg(format!(
        "{}/tests/support/grpc/{script}",
        env!("CARGO_MANIFEST_DIR")
    ));
    command
}

/// What a test says when the peer did not start.
pub fn missing() -> String {
    format!(
        "the gRPC tests need grpcio for {}: run .ci/deps/grpcio.sh (or set CAPATAZ_TEST_PYTHON)",
        python()
    )
}
