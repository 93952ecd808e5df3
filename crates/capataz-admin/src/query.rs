//! Strict query strings for the admin API: a page or action that takes one parameter refuses
//! any other (a typo that was ignored, `?tll=10m` or `?pol=web`, would silently do something
//! else) and refuses it twice.

use super::routes::percent_decode;

/// Why a query string is refused, the rest of a 400 answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// An escape is not `%XX`, or the bytes are not UTF-8 (the query, as sent).
    #[error("the query {0:?} has a bad percent-encoding")]
    BadEncoding(String),
    /// A parameter other than the one allowed.
    #[error("unknown query parameter {key:?} (the only one is {name}, e.g. {example})")]
    Unknown {
        /// The parameter given.
        key: String,
        /// The one allowed.
        name: &'static str,
        /// A right query.
        example: &'static str,
    },
    /// The parameter twice (its name).
    #[error("{0} is given twice (give it once)")]
    Twice(&'static str),
}

/// The value of the only parameter `name` allowed in `query` (`+` and percent-encoding
/// decoded): `None` without a query or without the parameter; an error naming the problem for
/// a bad percent-encoding, another parameter (`example` shows a right one), or `name` twice.
pub(super) fn single(
    query: Option<&str>,
    name: &'static str,
    example: &'static str,
) -> Result<Option<String>, QueryError> {
    let Some(query) = query else {
        return Ok(None);
    };
    let mut found = None;
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |text: &str| {
            percent_decode(&text.replace('+', " "))
                .ok_or_else(|| QueryError::BadEncoding(query.to_owned()))
        };
        let (key, value) = (decode(key)?, decode(value)?);
        if key != name {
            return Err(QueryError::Unknown { key, name, example });
        }
        if found.is_some() {
            return Err(QueryError::Twice(name));
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
        assert_eq!(
            other.to_string(),
            "unknown query parameter \"pol\" (the only one is pool, e.g. ?pool=web)"
        );
        let twice = single(Some("pool=a&pool=b"), "pool", "?pool=web").unwrap_err();
        assert_eq!(twice.to_string(), "pool is given twice (give it once)");
        let bad = single(Some("pool=%zz"), "pool", "?pool=web").unwrap_err();
        assert_eq!(
            bad.to_string(),
            "the query \"pool=%zz\" has a bad percent-encoding"
        );
    }
}
