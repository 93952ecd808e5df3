//! [`Keys`]: the keys under a source's prefix and the backends their values make. Pure: puts
//! and deletes in, a membership and the keys to tell about out.
//!
//! A value is `{"address": "ip:port", "weight": N, "name": "..."}` (JSON, at most
//! [`MAX_VALUE`] bytes; `weight` 1-1000, default 1; `name` optional, by default the key
//! without the prefix, or the address when that is no name; other fields are ignored). A
//! value that is no backend counts as absent (the key is told once per value written), and so
//! does a key whose name another key (earlier in key order) already has.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use crate::MAX_MEMBERS;
use capataz_config::BackendConfig;

/// The longest value read, in bytes.
pub(super) const MAX_VALUE: usize = 4096;

/// The longest backend name taken from a value or a key.
const MAX_NAME: usize = 128;

/// A key whose value is no backend, to tell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Skipped {
    /// The key, as text.
    pub(super) key: String,
    /// What is wrong.
    pub(super) error: String,
}

/// The keys of one prefix.
#[derive(Debug)]
pub(super) struct Keys {
    prefix: Vec<u8>,
    entries: BTreeMap<Vec<u8>, Entry>,
    /// Keys already told about, with the revision of the value told.
    told: HashMap<Vec<u8>, i64>,
}

#[derive(Debug)]
struct Entry {
    revision: i64,
    value: Result<BackendConfig, String>,
}

impl Keys {
    pub(super) fn new(prefix: &[u8]) -> Keys {
        Keys {
            prefix: prefix.to_vec(),
            entries: BTreeMap::new(),
            told: HashMap::new(),
        }
    }

    /// Replaces every key with `kvs` (a full read of the prefix); the keys not kept (beyond
    /// [`MAX_MEMBERS`]) are returned.
    pub(super) fn replace(
        &mut self,
        kvs: impl IntoIterator<Item = (Vec<u8>, Vec<u8>, i64)>,
    ) -> Vec<Skipped> {
        self.entries.clear();
        let mut dropped = Vec::new();
        for (key, value, revision) in kvs {
            dropped.extend(self.put(key, &value, revision));
        }
        let entries = &self.entries;
        self.told.retain(|key, _| entries.contains_key(key));
        dropped
    }

    /// A key written. Beyond [`MAX_MEMBERS`] keys a new one is not kept: it is returned, to
    /// tell at once.
    pub(super) fn put(&mut self, key: Vec<u8>, value: &[u8], revision: i64) -> Option<Skipped> {
        if self.entries.len() >= MAX_MEMBERS && !self.entries.contains_key(&key) {
            return Some(Skipped {
                key: text(&key),
                error: format!("the prefix already has {MAX_MEMBERS} keys, the most a pool takes"),
            });
        }
        let value = backend(&self.prefix, &key, value);
        self.entries.insert(key, Entry { revision, value });
        None
    }

    /// A key deleted.
    pub(super) fn delete(&mut self, key: &[u8]) {
        self.entries.remove(key);
        self.told.remove(key);
    }

    /// The backends now (sorted by name) and the keys to tell about that were not told yet.
    pub(super) fn members(&mut self) -> (Vec<BackendConfig>, Vec<Skipped>) {
        let mut members = Vec::with_capacity(self.entries.len());
        let mut names: HashMap<&str, &[u8]> = HashMap::with_capacity(self.entries.len());
        let mut skipped = Vec::new();
        for (key, entry) in &self.entries {
            let error = match &entry.value {
                Err(error) => error.clone(),
                Ok(backend) => match names.get(backend.name.as_str()) {
                    Some(other) => format!(
                        "the name {:?} is already the name of key {:?}",
                        backend.name,
                        text(other)
                    ),
                    None => {
                        names.insert(&backend.name, key);
                        members.push(backend.clone());
                        continue;
                    }
                },
            };
            if self.told.get(key) != Some(&entry.revision) {
                skipped.push((key.clone(), entry.revision, error));
            }
        }
        let skipped = skipped
            .into_iter()
            .map(|(key, revision, error)| {
                let told = Skipped {
                    key: text(&key),
                    error,
                };
                self.told.insert(key, revision);
                told
            })
            .collect();
        members.sort_by(|a, b| a.name.cmp(&b.name));
        (members, skipped)
    }
}

/// A key as text, for events (bytes that are not UTF-8 replaced, at most 256 characters).
fn text(key: &[u8]) -> String {
    String::from_utf8_lossy(key).chars().take(256).collect()
}

/// Whether `name` can name a backend: 1 to [`MAX_NAME`] bytes, no control characters.
fn is_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME && !name.chars().any(char::is_control)
}

/// The backend of `value` at `key`, or what is wrong with it.
fn backend(prefix: &[u8], key: &[u8], value: &[u8]) -> Result<BackendConfig, String> {
    if value.len() > MAX_VALUE {
        return Err(format!(
            "the value has {} bytes, more than the {MAX_VALUE} a backend may have",
            value.len()
        ));
    }
    let json: serde_json::Value =
        serde_json::from_slice(value).map_err(|e| format!("the value is not JSON ({e})"))?;
    let object = json
        .as_object()
        .ok_or(r#"the value is not a JSON object (write {"address": "ip:port", "weight": 1})"#)?;
    let address = match object.get("address") {
        Some(serde_json::Value::String(address)) => address,
        Some(_) => return Err("\"address\" is not a string".into()),
        None => return Err(r#"the value has no "address" (add "address": "ip:port")"#.into()),
    };
    let socket_addr: SocketAddr = address
        .parse()
        .ok()
        .filter(|a: &SocketAddr| a.port() != 0)
        .ok_or_else(|| {
            format!(
                "{:?} is not an ip:port address (host names are not resolved here)",
                address.chars().take(64).collect::<String>()
            )
        })?;
    let weight = match object.get("weight") {
        None => 1,
        Some(weight) => weight
            .as_u64()
            .filter(|w| (1..=1000).contains(w))
            .ok_or("\"weight\" is not an integer from 1 to 1000")? as u32,
    };
    let backup = match object.get("backup") {
        None => false,
        Some(backup) => backup.as_bool().ok_or("\"backup\" is not true or false")?,
    };
    let name = match object.get("name") {
        Some(serde_json::Value::String(name)) if is_name(name) => name.clone(),
        Some(_) => {
            return Err(format!(
                "\"name\" is not a name (text of 1 to {MAX_NAME} bytes without control characters)"
            ))
        }
        None => {
            let rest = key.strip_prefix(prefix).unwrap_or(key);
            let rest = std::str::from_utf8(rest).unwrap_or("");
            let rest = rest.trim_start_matches('/');
            if is_name(rest) {
                rest.to_owned()
            } else {
                socket_addr.to_string()
            }
        }
    };
    Ok(BackendConfig {
        name,
        address: socket_addr.to_string(),
        socket_addr,
        weight,
        backup,
        agent_port: None,
        track: None,
        limit: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(keys: &mut Keys, key: &str, value: &str, revision: i64) {
        assert_eq!(
            keys.put(key.as_bytes().to_vec(), value.as_bytes(), revision),
            None
        );
    }

    fn names(members: &[BackendConfig]) -> Vec<(&str, &str, u32)> {
        members
            .iter()
            .map(|m| (m.name.as_str(), m.address.as_str(), m.weight))
            .collect()
    }

    #[test]
    fn values_make_backends_named_by_value_key_or_address() {
        let mut keys = Keys::new(b"/web/");
        put(
            &mut keys,
            "/web/a",
            r#"{"address":"127.0.0.1:8001","weight":3}"#,
            2,
        );
        put(
            &mut keys,
            "/web/b",
            r#"{"address":"[::1]:8002","name":"bee","x":1}"#,
            3,
        );
        put(&mut keys, "/web/", r#"{"address":"127.0.0.1:8003"}"#, 4);
        let (members, skipped) = keys.members();
        assert_eq!(
            names(&members),
            vec![
                ("127.0.0.1:8003", "127.0.0.1:8003", 1),
                ("a", "127.0.0.1:8001", 3),
                ("bee", "[::1]:8002", 1),
            ]
        );
        assert!(skipped.is_empty());
    }

    #[test]
    fn bad_values_count_as_absent_and_are_told_once_per_value_written() {
        let mut keys = Keys::new(b"/web/");
        put(&mut keys, "/web/a", r#"{"address":"127.0.0.1:8001"}"#, 2);
        for (revision, bad) in [
            "{not json",
            "[1]",
            r#"{"weight":1}"#,
            r#"{"address":"web.example:80"}"#,
            r#"{"address":"127.0.0.1:0"}"#,
            r#"{"address":"127.0.0.1:1","weight":0}"#,
            r#"{"address":"127.0.0.1:1","weight":1.5}"#,
            r#"{"address":"127.0.0.1:1","name":""}"#,
            r#"{"address":"127.0.0.1:1","backup":"yes"}"#,
        ]
        .into_iter()
        .enumerate()
        {
            put(&mut keys, "/web/b", bad, 10 + revision as i64);
            let (members, skipped) = keys.members();
            assert_eq!(names(&members), vec![("a", "127.0.0.1:8001", 1)], "{bad}");
            assert_eq!(skipped.len(), 1, "{bad}");
            assert_eq!(skipped[0].key, "/web/b");
            // The same value again is not told again.
            assert!(keys.members().1.is_empty());
        }
        let huge = format!(
            r#"{{"address":"127.0.0.1:1","pad":"{}"}}"#,
            "x".repeat(MAX_VALUE)
        );
        put(&mut keys, "/web/b", &huge, 30);
        assert!(keys.members().1[0].error.contains("more than the 4096"));
    }

    #[test]
    fn a_name_already_taken_by_an_earlier_key_is_skipped() {
        let mut keys = Keys::new(b"/web/");
        put(
            &mut keys,
            "/web/a",
            r#"{"address":"127.0.0.1:8001","name":"x"}"#,
            2,
        );
        put(
            &mut keys,
            "/web/b",
            r#"{"address":"127.0.0.1:8002","name":"x"}"#,
            3,
        );
        let (members, skipped) = keys.members();
        assert_eq!(names(&members), vec![("x", "127.0.0.1:8001", 1)]);
        assert_eq!(skipped[0].key, "/web/b");
        keys.delete(b"/web/a");
        let (members, skipped) = keys.members();
        assert_eq!(names(&members), vec![("x", "127.0.0.1:8002", 1)]);
        assert!(skipped.is_empty());
    }

    #[test]
    fn a_full_read_replaces_every_key_and_the_count_is_bounded() {
        let mut keys = Keys::new(b"/web/");
        put(&mut keys, "/web/old", r#"{"address":"127.0.0.1:8001"}"#, 2);
        let all = (0..=MAX_MEMBERS).map(|i| {
            (
                format!("/web/{i:05}").into_bytes(),
                format!(r#"{{"address":"127.0.0.1:{}"}}"#, 1 + i).into_bytes(),
                5,
            )
        });
        let dropped = keys.replace(all);
        assert_eq!(dropped.len(), 1);
        assert_eq!(dropped[0].key, format!("/web/{MAX_MEMBERS:05}"));
        let (members, _) = keys.members();
        assert_eq!(members.len(), MAX_MEMBERS);
        assert!(members.iter().all(|m| m.name != "old"));
    }
}
