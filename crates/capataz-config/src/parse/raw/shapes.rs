//! The two shapes of value the raw model reads by hand: a table, and one word of a few.
//!
//! serde's derive would take a struct from a list as well as from a table, by position
//! (`active = ["http", "/healthz", ...]`), and says what it expected in Rust's words ("struct
//! RawActive with 23 elements"); a derived enum takes `{ round_robin = [] }` as well as
//! `"round_robin"`, and the TOML deserializer turns a number given for it into "wanted string
//! or table". Here a table is read from a table only and expects "a table", and a word from a
//! string only and expects `one of "a", "b"`: what `wording` then turns into the operator's
//! message.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserializer, MapAccess, Unexpected, Visitor};

/// A struct of the raw model, read from a TOML table and from nothing else.
pub(in super::super) trait Table: Sized {
    /// Reads the table's keys: the derived code (`#[serde(remote = "Self")]`).
    fn from_map<'de, A: MapAccess<'de>>(map: A) -> Result<Self, A::Error>;
}

/// Reads a [`Table`]; anything but a table is an error that expects "a table".
pub(super) fn deserialize_table<'de, D: Deserializer<'de>, T: Table>(
    deserializer: D,
) -> Result<T, D::Error> {
    struct TableVisitor<T>(PhantomData<T>);
    impl<'de, T: Table> Visitor<'de> for TableVisitor<T> {
        type Value = T;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a table")
        }

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::from_map(map)
        }
    }
    deserializer.deserialize_map(TableVisitor(PhantomData))
}

/// Implements [`Table`] and `Deserialize` for structs whose derive is `#[serde(remote =
/// "Self")]` (which leaves the derived code as an inherent `deserialize`).
macro_rules! tables {
    ($($name:ident),+ $(,)?) => {$(
        impl shapes::Table for $name {
            fn from_map<'de, A: serde::de::MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
                $name::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                shapes::deserialize_table(deserializer)
            }
        }
    )+};
}
pub(super) use tables;

/// Reads one of `words` (or of `aliases`, which messages do not list) from a string; anything
/// else is an error that expects `one of "a", "b"`.
pub(super) fn deserialize_choice<'de, D: Deserializer<'de>, T: Copy + 'static>(
    deserializer: D,
    words: &'static [(&'static str, T)],
    aliases: &'static [(&'static str, T)],
) -> Result<T, D::Error> {
    struct Choice<T: 'static> {
        words: &'static [(&'static str, T)],
        aliases: &'static [(&'static str, T)],
    }
    impl<'de, T: Copy> Visitor<'de> for Choice<T> {
        type Value = T;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("one of ")?;
            for (index, (word, _)) in self.words.iter().enumerate() {
                if index > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{word:?}")?;
            }
            Ok(())
        }

        fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<T, E> {
            self.words
                .iter()
                .chain(self.aliases)
                .find(|(word, _)| *word == text)
                .map(|&(_, value)| value)
                .ok_or_else(|| E::invalid_value(Unexpected::Str(text), &self))
        }
    }
    deserializer.deserialize_str(Choice { words, aliases })
}

/// Declares an enum of the raw model read with [`deserialize_choice`]: `Name { Variant =
/// "word", Other = "other" | "alias" }`.
macro_rules! choice {
    ($(#[$meta:meta])* $name:ident {
        $($variant:ident = $word:literal $(| $alias:literal)*),+ $(,)?
    }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(super) enum $name {
            $($variant),+
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                shapes::deserialize_choice(
                    deserializer,
                    &[$(($word, $name::$variant)),+],
                    &[$($(($alias, $name::$variant),)*)+],
                )
            }
        }
    };
}
pub(super) use choice;
