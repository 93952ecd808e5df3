//! A listener's HTTP/2 keys: `h2c` and `[listeners.http2]`, their defaults and bounds.

use capataz::config::Http2Config;

use super::*;

#[test]
fn http2_is_off_by_default_and_its_settings_have_defaults() {
    let listener = &parse(MINIMAL).listeners[0];
    assert!(!listener.h2c);
    assert_eq!(
        listener.http2,
        Http2Config {
            max_concurrent_streams: 100,
            max_backend_connections: 32,
            initial_stream_window_size: 262_144,
            initial_connection_window_size: 1_048_576,
            max_frame_size: 16_384,
            keepalive_interval: None,
            keepalive_timeout: Duration::from_secs(20),
        }
    );
    let example = &parse(&doc_example()).listeners[0];
    assert!(example.h2c);
    assert_eq!(example.http2.max_concurrent_streams, 100);
}

#[test]
fn http2_settings_are_read() {
    let text = "[[listeners]]\naddress = \"127.0.0.1:8080\"\nh2c = true\n\n\
        [listeners.http2]\nmax_concurrent_streams = 7\nmax_backend_connections = 3\n\
        initial_stream_window_size = 65535\n\
        initial_connection_window_size = 2147483647\nmax_frame_size = 16777215\n\
        keepalive_interval = \"15s\"\nkeepalive_timeout = \"3s\"\n\n\
        [pools.web]\nbackends = [{ address = \"127.0.0.1:9001\" }]\n";
    let listener = &parse(text).listeners[0];
    assert!(listener.h2c);
    assert_eq!(
        listener.http2,
        Http2Config {
            max_concurrent_streams: 7,
            max_backend_connections: 3,
            initial_stream_window_size: 65_535,
            initial_connection_window_size: 2_147_483_647,
            max_frame_size: 16_777_215,
            keepalive_interval: Some(Duration::from_secs(15)),
            keepalive_timeout: Duration::from_secs(3),
        }
    );
}

#[test]
fn http2_settings_out_of_bounds_name_their_key() {
    for (line, key) in [
        ("max_concurrent_streams = 0", "max_concurrent_streams"),
        ("max_concurrent_streams = 10001", "max_concurrent_streams"),
        ("max_backend_connections = 0", "max_backend_connections"),
        ("max_backend_connections = 10001", "max_backend_connections"),
        (
            "initial_stream_window_size = 65534",
            "initial_stream_window_size",
        ),
        (
            "initial_stream_window_size = 2147483648",
            "initial_stream_window_size",
        ),
        (
            "initial_connection_window_size = 1000",
            "initial_connection_window_size",
        ),
        ("max_frame_size = 16383", "max_frame_size"),
        ("max_frame_size = 16777216", "max_frame_size"),
        ("keepalive_interval = \"0s\"", "keepalive_interval"),
        ("keepalive_timeout = 5", "keepalive_timeout"),
        ("max_streams = 5", "max_streams"),
    ] {
        let text = format!(
            "[[listeners]]\naddress = \"127.0.0.1:8080\"\n\n[listeners.http2]\n{line}\n\n\
             [pools.web]\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n"
        );
        let error = check_err(&text, Some(5), &format!("listeners[0].http2.{key}"));
        assert!(!error.to_string().is_empty());
    }
}
