//! Header rules (`request_headers`, `response_headers` on a listener and on a route), the
//! forwarded fields a listener adds (`forwarded`), and its request id (`request_id`),
//! validated.
//!
//! A value is a template: text and variables (`%{client_ip}`). One without variables is a
//! [`HeaderValue`] already, checked when the config is read; one with variables is rendered
//! per request, and a rendering that is not a valid field value is not sent.

use http::{HeaderName, HeaderValue};

/// What a template may name, and what it renders as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variable {
    /// `%{client_ip}`: the client's IP address (from a PROXY protocol header when trusted).
    ClientIp,
    /// `%{client_port}`: the client's port.
    ClientPort,
    /// `%{request_id}`: the request's id (needs the listener's `request_id`).
    RequestId,
    /// `%{backend}`: the name of the backend that answered (response rules only).
    Backend,
    /// `%{pool}`: the route's pool.
    Pool,
    /// `%{tls_version}`: `TLSv1.2` or `TLSv1.3`; empty without TLS.
    TlsVersion,
    /// `%{tls_sni}`: the server name the client sent; empty without one.
    TlsSni,
    /// `%{scheme}`: `http` or `https`.
    Scheme,
    /// `%{host}`: the request's host as it sent it, port included.
    Host,
}

impl Variable {
    /// Every variable, by the name a template writes.
    pub const ALL: [(&'static str, Variable); 9] = [
        ("client_ip", Variable::ClientIp),
        ("client_port", Variable::ClientPort),
        ("request_id", Variable::RequestId),
        ("backend", Variable::Backend),
        ("pool", Variable::Pool),
        ("tls_version", Variable::TlsVersion),
        ("tls_sni", Variable::TlsSni),
        ("scheme", Variable::Scheme),
        ("host", Variable::Host),
    ];
}

/// One piece of a template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Text written as is (valid in a field value).
    Text(String),
    /// A variable's value.
    Var(Variable),
}

/// A header value as written in a rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Template {
    /// No variable: the value, checked when the config was read.
    Static(HeaderValue),
    /// Text and variables, rendered per request.
    Dynamic(Vec<Piece>),
}

impl Template {
    /// The template of `text`: `%{NAME}` is variable NAME; any other `%` is text. The error
    /// says what is wrong.
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(start) = rest.find("%{") {
            let Some(len) = rest[start + 2..].find('}') else {
                return Err(format!(
                    "\"%{{\" at byte {} is not closed by \"}}\" (write %{{client_ip}}, ...)",
                    text.len() - rest.len() + start
                ));
            };
            let name = &rest[start + 2..start + 2 + len];
            let Some((_, var)) = Variable::ALL.iter().find(|(known, _)| *known == name) else {
                let known: Vec<_> = Variable::ALL.iter().map(|(name, _)| *name).collect();
                return Err(format!(
                    "%{{{name}}} is not a variable (use one of {})",
                    known.join(", ")
                ));
            };
            if start > 0 {
                pieces.push(Piece::Text(rest[..start].to_owned()));
            }
            pieces.push(Piece::Var(*var));
            rest = &rest[start + 3 + len..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_owned()));
        }
        let text_ok = pieces.iter().all(|piece| match piece {
            Piece::Text(text) => HeaderValue::from_str(text).is_ok(),
            Piece::Var(_) => true,
        });
        if !text_ok {
            return Err("a header value may not hold control characters (CR, LF, NUL, ...)".into());
        }
        match pieces.as_slice() {
            [] => Ok(Template::Static(HeaderValue::from_static(""))),
            [Piece::Text(text)] => HeaderValue::from_str(text)
                .map(Template::Static)
                .map_err(|_| "not a valid header value".into()),
            _ => Ok(Template::Dynamic(pieces)),
        }
    }

    /// Whether it names `var`.
    pub fn uses(&self, var: Variable) -> bool {
        matches!(self, Template::Dynamic(pieces) if pieces.contains(&Piece::Var(var)))
    }
}

/// One set of header rules, applied in this order: `remove`, then `set` (replacing every
/// field of that name), then `add` (beside any already there).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeaderRules {
    /// Fields removed.
    pub remove: Vec<HeaderName>,
    /// Fields replaced by one with this value.
    pub set: Vec<(HeaderName, Template)>,
    /// Fields added.
    pub add: Vec<(HeaderName, Template)>,
}

impl HeaderRules {
    /// Whether any value names `var`.
    pub fn uses(&self, var: Variable) -> bool {
        self.set.iter().chain(&self.add).any(|(_, t)| t.uses(var))
    }
}

/// Which forwarded fields requests get on their way to a backend (`forwarded`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardedFields {
    /// `X-Forwarded-For` (appended) and `X-Forwarded-Proto` (the default).
    XForwarded,
    /// `Forwarded` (RFC 7239), an element `for=...;proto=...;host=...` appended.
    Rfc7239,
    /// Both.
    Both,
    /// None: the request's own pass untouched.
    None,
}

impl ForwardedFields {
    /// Whether the `X-Forwarded-*` fields are set.
    pub fn x_forwarded(self) -> bool {
        matches!(self, ForwardedFields::XForwarded | ForwardedFields::Both)
    }

    /// Whether a `Forwarded` element is appended.
    pub fn rfc7239(self) -> bool {
        matches!(self, ForwardedFields::Rfc7239 | ForwardedFields::Both)
    }
}

/// A listener's request id (`request_id`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestIdConfig {
    /// The field it travels in (default `X-Request-Id`).
    pub header: HeaderName,
    /// Whether a request's own id (a valid one) is kept rather than replaced (default true).
    pub keep_incoming: bool,
    /// Whether answers to the client carry it too (default false).
    pub response: bool,
}

/// A TLS listener's `Strict-Transport-Security` (`hsts`), sent on every answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hsts {
    /// `max-age` (default one year).
    pub max_age: std::time::Duration,
    /// `includeSubDomains` (default false).
    pub include_subdomains: bool,
    /// `preload` (default false; needs `include_subdomains` and a year at least).
    pub preload: bool,
}

impl Hsts {
    /// The field's value.
    pub fn value(&self) -> HeaderValue {
        let mut text = format!("max-age={}", self.max_age.as_secs());
        if self.include_subdomains {
            text.push_str("; includeSubDomains");
        }
        if self.preload {
            text.push_str("; preload");
        }
        // Digits and fixed words: always a valid value.
        HeaderValue::try_from(text).unwrap_or_else(|_| HeaderValue::from_static("max-age=0"))
    }
}

/// The longest incoming request id kept, in bytes; a longer one is replaced.
pub const MAX_REQUEST_ID: usize = 200;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_split_text_and_variables() {
        assert_eq!(
            Template::parse("a").unwrap(),
            Template::Static(HeaderValue::from_static("a"))
        );
        assert_eq!(
            Template::parse("ip=%{client_ip}:%{client_port} 100%").unwrap(),
            Template::Dynamic(vec![
                Piece::Text("ip=".into()),
                Piece::Var(Variable::ClientIp),
                Piece::Text(":".into()),
                Piece::Var(Variable::ClientPort),
                Piece::Text(" 100%".into()),
            ])
        );
        assert!(Template::parse("%{host}").unwrap().uses(Variable::Host));
        let error = Template::parse("%{client}").unwrap_err();
        assert!(error.contains("not a variable"), "{error}");
        assert!(Template::parse("%{host")
            .unwrap_err()
            .contains("not closed"));
        assert!(Template::parse("a\r\nb").unwrap_err().contains("control"));
    }
}
