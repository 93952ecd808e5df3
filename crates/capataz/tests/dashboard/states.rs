//! Regression: the timeline drew a passively ejected backend in the DOWN colour while
//! its badge used the ejection colour, and the legend's swatches were shades of their own. Now
//! each kind of state has one colour: a backend's badge, the stretch of its timeline for the
//! state it is in, and the legend's entry for that kind are drawn in the same colour, and no two
//! kinds share one.

use super::*;

/// Each backend's badge colour and the colour and title of its timeline's last stretch (the
/// state in force), and each legend entry's words and swatch colour, as the browser draws them.
const READ_COLOURS: &str = r##"
const colour = (el, property) => el ? getComputedStyle(el)[property] : null;
return {
  backends: Array.from(document.querySelectorAll("tbody[data-backend]")).map((el) => {
    const rects = el.querySelectorAll(".timeline rect");
    const last = rects.length ? rects[rects.length - 1] : null;
    return {
      backend: el.dataset.backend,
      state: el.querySelector(".state").textContent.trim(),
      qualifiers: Array.from(el.querySelectorAll(".qual")).map((q) => q.textContent),
      badge: colour(el.querySelector(".badge.state"), "backgroundColor"),
      stretch: colour(last, "fill"),
      stretch_title: last ? last.textContent : "",
    };
  }),
  legend: Array.from(document.querySelectorAll("#legend .sw")).map((sw) => ({
    words: sw.parentElement.textContent.trim(),
    colour: colour(sw, "backgroundColor"),
  })),
};
"##;

const PASSIVE: &str = r#"
[pools.web.passive]
consecutive_errors = 3
ejection_time = "60s"
max_ejected_percent = 100
"#;

fn row<'v>(page: &'v Value, name: &str) -> &'v Value {
    page["backends"]
        .as_array()
        .and_then(|b| b.iter().find(|b| b["backend"] == name))
        .unwrap_or_else(|| panic!("no backend {name}: {page:#}"))
}

/// Whether `name` shows `state` (and, when given, a qualifier containing `qualifier`) on its
/// badge and on its timeline's last stretch (whose title names the state and the qualifier).
fn shows(page: &Value, name: &str, state: &str, qualifier: Option<&str>) -> bool {
    let b = row(page, name);
    let title = b["stretch_title"].as_str().unwrap_or_default();
    let qualified = qualifier.is_none_or(|q| {
        title.contains(&format!("({q}"))
            && b["qualifiers"].as_array().is_some_and(|all| {
                all.iter()
                    .any(|x| x.as_str().is_some_and(|x| x.starts_with(q)))
            })
    });
    b["state"] == state && title.contains(&format!(" UTC {state}")) && qualified
}

#[test]
fn dashboard_draws_each_state_in_one_colour_on_badge_timeline_and_legend() {
    let driver = browser();
    let extra = format!("{FAST_CHECKS}{PASSIVE}");
    let started = start_balancer(&["up", "ejected", "drained", "down"], &[], &extra);
    let admin = started.balancer.admin_addr().expect("the admin API runs");
    let listener = started.balancer.local_addrs()[0];
    let session = driver.session();
    session.navigate(&format!("http://{admin}/"));
    let end = Instant::now() + DEADLINE;
    while !["up", "ejected", "drained", "down"]
        .iter()
        .all(|name| shows(&session.execute(READ_COLOURS), name, "UP", None))
    {
        assert!(Instant::now() < end, "the backends never showed UP");
        std::thread::sleep(Duration::from_millis(50));
    }

    // `ejected` answers its traffic 500 (its probes still pass): passive checks eject it.
    // `drained` is drained by hand, `down` fails its probes.
    started.sims[1].set_traffic(Mode::Status(500));
    assert_eq!(request(admin, "POST", "/backends/web/drained/drain"), 200);
    started.sims[3].set_health(Mode::Status(503));
    let end = Instant::now() + DEADLINE;
    let page = loop {
        for _ in 0..4 {
            request(listener, "GET", "/");
        }
        let page = session.execute(READ_COLOURS);
        let ejected = row(&page, "ejected");
        if shows(&page, "up", "UP", None)
            && ejected["qualifiers"].as_array().is_some_and(|q| {
                q.iter()
                    .any(|q| q.as_str().is_some_and(|q| q.starts_with("ejected")))
            })
            && ejected["stretch_title"]
                .as_str()
                .is_some_and(|t| t.contains("(ejected"))
            && shows(&page, "drained", "DRAINING", None)
            && shows(&page, "down", "DOWN", None)
        {
            break page;
        }
        assert!(
            Instant::now() < end,
            "the page did not show the four states within {DEADLINE:?}: {page:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };

    let legend = |words: &str| -> String {
        page["legend"]
            .as_array()
            .and_then(|l| {
                l.iter()
                    .find(|e| e["words"].as_str().is_some_and(|w| w.starts_with(words)))
            })
            .and_then(|e| e["colour"].as_str())
            .unwrap_or_else(|| panic!("no legend entry for {words:?}: {page:#}"))
            .to_owned()
    };
    // The passively ejected one first: the bug.
    let mut colours = Vec::new();
    for (name, words) in [
        ("ejected", "ejected"),
        ("up", "UP"),
        ("drained", "held"),
        ("down", "DOWN"),
    ] {
        let b = row(&page, name);
        let expected = legend(words);
        assert_eq!(
            (b["badge"].as_str(), b["stretch"].as_str()),
            (Some(expected.as_str()), Some(expected.as_str())),
            "{name}: its badge and its timeline's stretch in the legend's colour for \
             {words:?}: {page:#}"
        );
        colours.push(expected);
    }
    colours.sort();
    colours.dedup();
    assert_eq!(colours.len(), 4, "four kinds, four colours: {page:#}");
    let entries = page["legend"].as_array().map_or(0, Vec::len);
    let mut all: Vec<&str> = page["legend"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["colour"].as_str())
        .collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), entries, "one colour per legend entry: {page:#}");

    session.delete();
    drop(driver);
    drop(started);
}
