//! Small enums that several tasks read and change, each kept in an `AtomicU8`: typed, so that
//! nothing but one of its values can be stored, and read back as the enum, never as a number.
//!
//! `atomic_enum!` declares the enum (`#[repr(u8)]`, its variants numbered from 0 in order,
//! ordered as declared) and its cell, with the atomic operations the states need.

/// Declares `enum $name { ... }` and `struct $cell`, the enum in an `AtomicU8`.
#[macro_export]
macro_rules! atomic_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident in $cell:ident {
            $($(#[$variant_meta:meta])* $variant:ident,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
        #[repr(u8)]
        $vis enum $name {
            $($(#[$variant_meta])* $variant,)+
        }

        impl $name {
            /// Every value, by its number.
            const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The value numbered `n` (only ever one this enum stored).
            fn from_u8(n: u8) -> $name {
                Self::ALL[usize::from(n)]
            }
        }

        #[doc = concat!("A [`", stringify!($name), "`] in an `AtomicU8`.")]
        #[derive(Debug)]
        $vis struct $cell(std::sync::atomic::AtomicU8);

        #[allow(dead_code)]
        impl $cell {
            /// A cell holding `value`.
            $vis const fn new(value: $name) -> $cell {
                $cell(std::sync::atomic::AtomicU8::new(value as u8))
            }

            /// The value now.
            $vis fn load(&self, order: std::sync::atomic::Ordering) -> $name {
                $name::from_u8(self.0.load(order))
            }

            /// Stores `value`.
            $vis fn store(&self, value: $name, order: std::sync::atomic::Ordering) {
                self.0.store(value as u8, order);
            }

            /// Stores `new` if the value is `current`; the value before, either way.
            $vis fn compare_exchange(
                &self,
                current: $name,
                new: $name,
                success: std::sync::atomic::Ordering,
                failure: std::sync::atomic::Ordering,
            ) -> Result<$name, $name> {
                self.0
                    .compare_exchange(current as u8, new as u8, success, failure)
                    .map($name::from_u8)
                    .map_err($name::from_u8)
            }

            /// Raises the value to `value` if it is below (in declaration order); the value
            /// before.
            $vis fn fetch_max(&self, value: $name, order: std::sync::atomic::Ordering) -> $name {
                $name::from_u8(self.0.fetch_max(value as u8, order))
            }

            /// Stores what `next` makes of the value, unless it makes nothing of it.
            $vis fn update(
                &self,
                order: std::sync::atomic::Ordering,
                mut next: impl FnMut($name) -> Option<$name>,
            ) -> Result<$name, $name> {
                self.0
                    .fetch_update(order, order, |now| next($name::from_u8(now)).map(|v| v as u8))
                    .map($name::from_u8)
                    .map_err($name::from_u8)
            }
        }
    };
}

pub use crate::atomic_enum;

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;

    atomic_enum! {
        /// A test's states.
        enum Light in LightCell {
            Off,
            Dim,
            Bright,
        }
    }

    #[test]
    fn values_go_in_and_come_out_as_themselves() {
        let cell = LightCell::new(Light::Off);
        assert_eq!(cell.load(Relaxed), Light::Off);
        cell.store(Light::Bright, Relaxed);
        assert_eq!(cell.load(Relaxed), Light::Bright);
        assert_eq!(
            cell.compare_exchange(Light::Dim, Light::Off, Relaxed, Relaxed),
            Err(Light::Bright)
        );
        assert_eq!(
            cell.compare_exchange(Light::Bright, Light::Dim, Relaxed, Relaxed),
            Ok(Light::Bright)
        );
        assert_eq!(cell.load(Relaxed), Light::Dim);
    }

    #[test]
    fn fetch_max_only_raises_in_declaration_order() {
        let cell = LightCell::new(Light::Dim);
        assert_eq!(cell.fetch_max(Light::Off, Relaxed), Light::Dim);
        assert_eq!(cell.load(Relaxed), Light::Dim);
        assert_eq!(cell.fetch_max(Light::Bright, Relaxed), Light::Dim);
        assert_eq!(cell.load(Relaxed), Light::Bright);
    }

    #[test]
    fn update_stores_what_it_is_given_or_nothing() {
        let cell = LightCell::new(Light::Off);
        assert_eq!(cell.update(Relaxed, |_| Some(Light::Dim)), Ok(Light::Off));
        assert_eq!(cell.update(Relaxed, |_| None), Err(Light::Dim));
        assert_eq!(cell.load(Relaxed), Light::Dim);
    }
}
