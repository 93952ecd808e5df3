//! `capataz man`: the manual page, capataz(1). The parts that follow the command line's
//! definition (synopsis, each subcommand with its options) are rendered from it by
//! clap_mangen, so they always match the binary that prints them; the rest (signals, files,
//! environment, exit status) is written here, in roff, from what the code does. It names no
//! page but its own: every subcommand is a subsection of this page, not a page of its own.

use std::io;

/// The whole page, in roff, for the command line `cli` (the binary's `clap::Command`).
pub fn render(cli: clap::Command) -> io::Result<String> {
    let mut cli = cli.disable_help_subcommand(true);
    cli.build();
    let man = clap_mangen::Man::new(cli.clone());
    let mut page = String::new();
    // Each piece comes with roff's preamble (the apostrophe string); the page keeps the first.
    page.push_str(&piece(|w| man.render_title(w), None, true)?);
    page.push_str(&piece(|w| man.render_name_section(w), None, false)?);
    page.push_str(&piece(|w| man.render_synopsis_section(w), None, false)?);
    page.push_str(DESCRIPTION);
    page.push_str(&piece(|w| man.render_options_section(w), None, false)?);
    page.push_str(".SH SUBCOMMANDS\n");
    for command in cli.get_subcommands().filter(|c| !c.is_hide_set()) {
        subcommand(&mut page, command.clone())?;
    }
    page.push_str(SIGNALS);
    page.push_str(FILES);
    page.push_str(ENVIRONMENT);
    page.push_str(EXIT_STATUS);
    page.push_str(SEE_ALSO);
    Ok(page)
}

/// One subcommand's subsection (`.SS capataz run`): its synopsis, description and options,
/// then those of its own subcommands (`capataz ctl drain`), whose options given to the parent
/// (`--admin` of `capataz ctl`) are listed once, under the parent.
fn subcommand(page: &mut String, command: clap::Command) -> io::Result<()> {
    let name = command.get_bin_name().unwrap_or(command.get_name());
    page.push_str(&format!(".SS \"{}\"\n", name.replace('-', "\\-")));
    let inner: Vec<clap::Command> = command
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(|c| {
            c.clone()
                .mut_args(|a| if a.is_global_set() { a.hide(true) } else { a })
        })
        .collect();
    let man = clap_mangen::Man::new(command.clone());
    page.push_str(&piece(
        |w| man.render_synopsis_section(w),
        Some(".SH SYNOPSIS\n"),
        false,
    )?);
    page.push_str(".PP\n");
    page.push_str(&piece(
        |w| man.render_description_section(w),
        Some(".SH DESCRIPTION\n"),
        false,
    )?);
    if command.get_arguments().any(|a| !a.is_hide_set()) {
        let options = piece(|w| man.render_options_section(w), None, false)?;
        // Under a subsection, the options are an indented list rather than a section.
        page.push_str(".RS\n");
        for line in options.lines() {
            if !line.starts_with(".SH ") {
                page.push_str(line);
                page.push('\n');
            }
        }
        page.push_str(".RE\n");
    }
    for inner in inner {
        subcommand(page, inner)?;
    }
    Ok(())
}

/// What `render` wrote, without roff's preamble unless `preamble`, and without the leading
/// `heading` line when given.
fn piece(
    render: impl FnOnce(&mut dyn io::Write) -> io::Result<()>,
    heading: Option<&str>,
    preamble: bool,
) -> io::Result<String> {
    let mut bytes = Vec::new();
    render(&mut bytes)?;
    let mut text = String::from_utf8(bytes).map_err(|e| io::Error::other(e.to_string()))?;
    if !preamble {
        let body: Vec<&str> = text
            .lines()
            .skip_while(|line| line.starts_with(".ie \\n(.g") || line.starts_with(".el .ds Aq"))
            .collect();
        text = body.join("\n") + "\n";
    }
    if let Some(heading) = heading {
        if let Some(rest) = text.strip_prefix(heading) {
            text = rest.to_owned();
        }
    }
    Ok(text)
}

const DESCRIPTION: &str = r#".SH DESCRIPTION
capataz is an HTTP load balancer that keeps its pool honest: it probes every backend on a
timer (active checks), learns from every response it relays (passive checks), and sends a
request only to a backend both consider healthy.
.PP
\fBcapataz run\fR serves the configuration file it is given (TOML): listeners, routes, pools
of backends, their health checks, the admin API.
Every key, its default and its meaning are in \fIdocs/config.md\fR, and running it (the
admin API, events, reloads, upgrades, metrics, systemd) in \fIdocs/operating.md\fR, both in
capataz's source tree.
\fBcapataz check\fR validates a file without running it; \fBcapataz demo\fR runs a
self-contained demonstration that needs no file.
\fBcapataz status\fR, \fBcapataz top\fR and \fBcapataz ctl\fR talk to a running balancer
through its admin API (127.0.0.1:9901 unless \fB\-\-admin\fR says otherwise).
"#;

const SIGNALS: &str = r#".SH SIGNALS
\fBcapataz run\fR installs its handlers before it listens:
.TP
\fBSIGHUP\fR
Reloads the configuration file, as \fBcapataz ctl reload\fR does: the file is read and
validated off the threads that serve; a valid one is applied without dropping a connection
(backends that stay keep their health state), an invalid one is refused with its errors
logged, and the running configuration stays.
.TP
\fBSIGTERM\fR, \fBSIGINT\fR
Drains and exits 0: no new connections; requests in flight finish, for up to
\fBserver.shutdown_timeout\fR (30 s by default); whatever is still open then is closed.
.TP
\fBSIGUSR2\fR
Upgrades the binary without downtime: starts the binary found at the path this process was
started from, with the same arguments, and hands it every listening socket; the new process
probes every backend before it accepts, then the old one drains as on SIGTERM and exits 0.
If the new process fails or is not ready in time, the old one keeps serving.
A second SIGUSR2 during an upgrade is ignored.
.PP
A new process of an upgrade, until it has taken over, exits on SIGTERM or SIGINT (the old one
keeps serving) and ignores SIGHUP and SIGUSR2.
\fBcapataz demo\fR stops on SIGINT (Ctrl-C); \fBcapataz top\fR quits on q or Ctrl-C.
"#;

const FILES: &str = r#".SH FILES
.TP
\fI/etc/capataz/capataz.toml\fR
The configuration file of the systemd unit (\fIcontrib/systemd/capataz.service\fR) and of the
container image; \fBcapataz run\fR itself reads only the file it is given.
\fIcontrib/capataz.toml\fR in the source tree is a commented example.
.TP
\fI/etc/resolv.conf\fR
The DNS servers of a \fBdns\fR pool that names no resolver.
.TP
\fI/etc/ssl/certs\fR
The system's CA certificates (found as the platform does, or through \fBSSL_CERT_FILE\fR and
\fBSSL_CERT_DIR\fR): what backends' certificates and an ACME directory must chain to when no
\fBca_file\fR is given.
.TP
\fI/var/lib/capataz\fR
State of the systemd unit and the container: an ACME listener's \fBstorage\fR belongs there.
"#;

const ENVIRONMENT: &str = r#".SH ENVIRONMENT
.TP
\fBCAPATAZ_WORKER_THREADS\fR
The number of worker threads that serve (default: one per core), each an event loop of its
own: the main thread's also runs the listeners' accept loops, the probes and the admin API,
and each client connection is served from its accept to its close by the worker with the
fewest open connections then. 1 runs the main thread's event loop alone, the cheapest per
request. A value that is not a positive number is ignored.
.TP
\fBCAPATAZ_WORKER_PINNING\fR
On Linux, when there are as many workers as CPUs the process may run on (the default count),
each worker thread is pinned to one of those CPUs, the main thread to the first, so that the
scheduler cannot put two workers on one CPU while another idles. \fBoff\fR (or \fB0\fR,
\fBfalse\fR, \fBno\fR, in any case) leaves them to the OS; any other value, or none,
pins. The threads that do blocking work (access log writes, name lookups) and the processes
capataz starts (a binary upgrade's, alert commands) are not pinned.
.TP
\fBCAPATAZ_ADMIN_TOKEN\fR
The bearer token of \fBcapataz status\fR, \fBtop\fR and \fBctl\fR, when \fB\-\-token\fR is
not given.
.TP
\fBRUST_LOG\fR
A log filter (such as \fBdebug\fR or \fBcapataz=trace\fR) that overrides the configuration's
\fBlog.level\fR.
.TP
\fB_RJEM_MALLOC_CONF\fR
Options of the allocator, jemalloc (in a build with the default \fBjemalloc\fR feature; its
MALLOC_CONF syntax), over capataz's own
(background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0), for example
\fBdirty_decay_ms:10000\fR.
.TP
\fBNOTIFY_SOCKET\fR
Set by systemd for a \fBType=notify\fR service: \fBcapataz run\fR sends READY=1,
RELOADING=1, STOPPING=1 and MAINPID= there.
.TP
\fBPATH\fR
\fBcapataz demo\fR looks for capataz on it: when this binary is not there, its banner names the
binary by its path (such as target/debug/capataz) in the commands it suggests.
.TP
\fBCOLUMNS\fR, \fBLINES\fR
The terminal's width and height for \fBcapataz top\fR when \fBstty size\fR cannot tell them
(default 80 and 24).
.TP
\fBSSL_CERT_FILE\fR, \fBSSL_CERT_DIR\fR
Where the system's CA certificates are, instead of the platform's usual place.
.TP
\fBCAPATAZ_HANDOVER_LISTENERS\fR, \fBCAPATAZ_HANDOVER_READY_FD\fR, \fBCAPATAZ_HANDOVER_QUIC\fR
Set by an upgrading process (SIGUSR2) for the new process it starts, and removed by it; not
for users: a malformed value stops the process.
.TP
${\fINAME\fR}
A configuration file may take string values from the environment: \fB${NAME}\fR,
\fB${NAME:\-default}\fR (see \fIdocs/config.md\fR).
.PP
Alert commands (\fB[[alerts.commands]]\fR) receive each event in CAPATAZ_EVENT,
CAPATAZ_POOL, CAPATAZ_BACKEND, CAPATAZ_FROM, CAPATAZ_TO, CAPATAZ_REASON, CAPATAZ_TIME,
CAPATAZ_SUPPRESSED and CAPATAZ_JSON (see \fIdocs/operating.md\fR).
"#;

const EXIT_STATUS: &str = r#".SH EXIT STATUS
Every subcommand exits 2 on a command-line error (an unknown option, a missing or bad
argument), with the usage on standard error.
.TP
\fBcapataz run\fR
0 after SIGTERM or SIGINT once drained, and in the old process after an upgrade handed over;
2 when the configuration is invalid or unreadable (nothing is bound);
1 on any other error (a port that cannot be bound, a takeover that failed).
.TP
\fBcapataz check\fR
0 when the file is valid, with or without warnings; 1 when it is valid with warnings under
\fB\-\-strict\fR; 2 when it is invalid or unreadable.
.TP
\fBcapataz demo\fR
0 when stopped by Ctrl-C or at the end of \fB\-\-duration\fR; 1 on an error (an address in
use).
.TP
\fBcapataz status\fR, \fBcapataz ctl\fR
0 when the admin API answered; 1 when it cannot be reached or refused the request (an
unknown pool or backend, a missing token).
.TP
\fBcapataz top\fR
0 when quit (q, Ctrl-C, the end of \fB\-\-iterations\fR, or a closed output); 1 when the
admin API cannot be read for the first frame (later failures are shown and retried).
.TP
\fBcapataz replay\fR
0 at the end of the input (also when the reader of its output goes away); 2 for settings the
balancer would refuse (a \fB\-\-set\fR or \fB\-\-config\fR value, an unknown \fB\-\-pool\fR);
1 when the script or the configuration cannot be read.
.TP
\fBcapataz completions\fR, \fBcapataz man\fR
0; 1 when standard output cannot be written (a reader that went away is not an error).
"#;

const SEE_ALSO: &str = r#".SH SEE ALSO
\fIdocs/config.md\fR (every key of the configuration file), \fIdocs/operating.md\fR (the admin
API, events, reloads, upgrades, metrics, systemd) and \fIREADME.md\fR (the demo, the replay
protocol), in capataz's source tree.
"#;
