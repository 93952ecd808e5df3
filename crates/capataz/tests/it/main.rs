//! Most of capataz's end-to-end tests, as modules of one test binary (one link instead of
//! one per file), on the shared scaffolding in `tests/support/`. The fault matrix
//! (`tests/faults.rs`: it counts the process's open files and runs one scenario at a time)
//! the Chromium dashboard test (`tests/dashboard.rs`), and the thirty hostile clients
//! (`tests/hostile_clients.rs`: it installs a process-wide log subscriber) are binaries of
//! their own. Metrics are registered per balancer, so the metrics tests run here beside the
//! others.

#[path = "../support/mod.rs"]
mod support;

mod access_log;
mod acme;
mod admin;
mod admin_hostile;
mod admin_web;
mod affinity;
mod alerts;
mod backend_tls;
mod balancer;
mod cli;
mod cli_forms;
mod config;
mod config_deploy;
mod config_dns;
mod contention;
mod dns_failures;
mod dns_source;
mod dns_srv_targets;
mod drain;
mod edge;
mod eligibility;
mod etcd_churn;
mod etcd_secure;
mod etcd_source;
mod first_hour;
mod fleet;
mod fleet_scale_out;
mod gray_failures;
mod grpc;
mod grpc_e2e;
mod h2;
mod h2_backends;
mod h2_nginx;
mod hostile_path;
mod http3;
mod listener_limit;
mod listener_limit_edges;
mod manual;
mod member_states;
mod metrics;
mod missing_tools;
mod module_graph;
mod ocsp;
mod packaging;
mod pool_handle;
mod probe_checks;
mod probe_kinds;
mod proxy_edge;
mod proxy_protocol;
mod queue;
mod record_replay;
mod reload_off_runtime;
mod replay_cli;
mod replay_what_if;
mod reported;
mod request_path;
mod route_rules;
mod scrape;
mod send_proxy;
mod tcp_mode;
mod terminal;
mod tls;
mod top_screen;

mod unix_sockets;
mod upgrade;
mod upgrade_http3;
mod upgrade_unix;
mod weights;
mod workers;
