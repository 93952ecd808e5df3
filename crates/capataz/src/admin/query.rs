//! Strict query strings for the admin API: a page or action that takes one parameter refuses
//! any other (a typo that was ignored, `?tll=10m` or `?pol=web`, would silently do something
//! else) and refuses it twice.

use super::routes::percent_decode;

/// The value of the only parameter `name` allowed in `query` (`+` and percent-encoding
/// decoded): `None` without a query or without the parameter; an error naming the problem for
/// a bad percent-encoding, another parameter (`example` shows a right one), or `name` twice.
pub(super) fn single(
    query: Option<&str>,
    name: &str,
    example: &str,
) -> Result<Option<String>, String> {
    let Some(query) = query else {
        return Ok(None);
    };
    let mut found = None;
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |text: &str| {
            percent_decode(&text.replace('+', " "))
                .ok_or_else(|| format!("the query {query:?} has a bad percent-encoding"))
        };
        let (key, value) = (decode(key)?, decode(value)?);
        if key != name {
            return Err(format!(
                "unknown query parameter {key:?} (the only one is {name}, e.g. {example})"
            ));
        }
        if found.is_some() {
            return Err(format!("{name} is given twice (give it once)"));
        }
        found = Some(value);
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::single;

    #[test]
    fn takes_one_parameter_and_refuses_others_and_repeats() {
        assert_eq!(single(None, "pool", "?pool=web"), Ok(None));
        assert_eq!(single(Some(""), "pool", "?pool=web"), Ok(None));
        assert_eq!(
            single(Some("pool=a%2Fb+c"), "pool", "?pool=web"),
            Ok(Some("a/b c".into()))
        );
        let other = single(Some("pol=web"), "pool", "?pool=web").unwrap_err();
        assert!(other.contains("unknown query parameter \"pol\""), "{other}");
        let twice = single(Some("pool=a&pool=b"), "pool", "?pool=web").unwrap_err();
        assert_eq!(twice, "pool is given twice (give it once)");
        let bad = single(Some("pool=%zz"), "pool", "?pool=web").unwrap_err();
        assert!(bad.contains("bad percent-encoding"), "{bad}");
    }
}
