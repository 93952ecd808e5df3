//! Regression: the charts always spanned 15 minutes and the timelines an hour, so a
//! young instance drew its samples as a dot at the right edge. Both now span the history that
//! exists, from the oldest sample (timelines: the oldest state kept) to now, at least a minute.

use super::*;

/// The pool's request-rate chart and backend `a`'s timeline as drawn, and the history as the
/// test reads it itself (a synchronous request from the page, parsed here, not by the page).
const READ_SPANS: &str = r##"
const pool = document.querySelector('section.pool[data-pool="web"]');
const chart = pool && pool.querySelector(".pool-charts svg.chart.c-rate");
const a = document.querySelector('tbody[data-backend="a"] svg.timeline');
if (!chart || !a) return null;
const path = chart.querySelector("path");
const xhr = new XMLHttpRequest();
xhr.open("GET", "/history/series", false);
xhr.send();
const history = JSON.parse(xhr.responseText);
const web = history.pools.find((p) => p.name === "web");
return {
  now: Date.now(),
  chart: {
    points: Number(chart.dataset.points),
    from: Number(chart.dataset.from),
    to: Number(chart.dataset.to),
    width: chart.width.baseVal.value,
    d: path ? path.getAttribute("d") : "",
  },
  timeline: {
    from: Number(a.dataset.from),
    to: Number(a.dataset.to),
    width: a.width.baseVal.value,
    rects: Array.from(a.querySelectorAll("rect")).map((r) => ({
      class: r.getAttribute("class"), x: Number(r.getAttribute("x")),
    })),
  },
  t: web.series.t,
  first_marks: Object.fromEntries(web.backends.map((b) =>
    [b.name, b.timeline.length ? Date.parse(b.timeline[0].at) : null])),
};
"##;

/// The x of each point of an SVG path of `M x y L x y ...` commands.
fn xs_of(d: &str) -> Vec<f64> {
    d.split(['M', 'L'])
        .filter_map(|command| command.split_whitespace().next()?.parse().ok())
        .collect()
}

fn number(value: &Value) -> f64 {
    value
        .as_f64()
        .unwrap_or_else(|| panic!("not a number: {value}"))
}

#[test]
fn dashboard_charts_of_a_young_instance_span_its_history_not_15_minutes() {
    let driver = browser();
    let started = start_balancer(&["a", "b"], &[], FAST_CHECKS);
    let admin = started.balancer.admin_addr().expect("the admin API runs");
    let listener = started.balancer.local_addrs()[0];
    let session = driver.session();
    session.navigate(&format!("http://{admin}/"));

    // Three samples (one every 5 s): ten seconds of history, some requests in it.
    let end = Instant::now() + DEADLINE;
    let read = loop {
        get(listener);
        let read = session.execute(READ_SPANS);
        if read["chart"]["points"].as_u64() >= Some(3) {
            break read;
        }
        assert!(
            Instant::now() < end,
            "no three samples within {DEADLINE:?}: {read:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let chart = &read["chart"];
    let width = number(&chart["width"]);
    let t: Vec<f64> = read["t"]
        .as_array()
        .expect("the samples' times")
        .iter()
        .map(number)
        .collect();
    let xs = xs_of(chart["d"].as_str().unwrap_or_default());
    assert!(xs.len() >= 3, "a line through the samples: {read:#}");
    let drawn = &t[..xs.len()];
    let oldest = t[0];
    let now = number(&read["now"]);

    // What shows: the samples cover the share of the width that their span is of the history
    // (at least a minute), not a dot at the right edge.
    let covered = xs[xs.len() - 1] - xs[0];
    let at_least = width * (drawn[drawn.len() - 1] - oldest) / (now - oldest).max(60_000.0);
    assert!(
        covered >= at_least - 0.5,
        "the samples of {:.0} s cover {covered:.1} of {width} px, not at least {at_least:.1}: \
         {read:#}",
        (drawn[drawn.len() - 1] - oldest) / 1000.0
    );
    // Exactly: the chart spans from the oldest sample to the page's now (at least a minute),
    // and each sample sits at its time on that span.
    let (from, to) = (number(&chart["from"]), number(&chart["to"]));
    assert_eq!(
        to - from,
        (to - oldest).clamp(60_000.0, 900_000.0),
        "{read:#}"
    );
    for (x, time) in xs.iter().zip(drawn) {
        let expected = (time - from) / (to - from) * width;
        assert!(
            (x - expected).abs() <= 0.1,
            "a sample at x {x}, not {expected}: {read:#}"
        );
    }

    // The timelines the same way, from the oldest state kept: `a`'s first stretch starts where
    // its first mark's time falls.
    let timeline = &read["timeline"];
    let (from, to) = (number(&timeline["from"]), number(&timeline["to"]));
    let first_marks: Vec<f64> = read["first_marks"]
        .as_object()
        .expect("first marks")
        .values()
        .filter_map(Value::as_f64)
        .collect();
    let oldest_mark = first_marks.iter().copied().fold(f64::INFINITY, f64::min);
    assert_eq!(
        to - from,
        (to - oldest_mark).clamp(60_000.0, 3_600_000.0),
        "{read:#}"
    );
    let a_first = number(&read["first_marks"]["a"]);
    let first_stretch = timeline["rects"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["class"] != "k-none"))
        .unwrap_or_else(|| panic!("a's timeline has a stretch: {read:#}"));
    let expected = ((a_first - from) / (to - from) * number(&timeline["width"])).max(0.0);
    assert!(
        (number(&first_stretch["x"]) - expected).abs() <= 0.1,
        "a's first stretch at {first_stretch}, not x {expected}: {read:#}"
    );

    session.delete();
    drop(driver);
    drop(started);
}
