//! Closed enums spelled once. Owns [`wire_enum!`], which declares a fieldless enum together
//! with the one table of its wire texts — how each value is written in JSON, YAML, store rows,
//! command-line values and metrics labels — and derives from that table everything that reads
//! or writes the text: `as_str`, `from_wire`, `ALL`, `TEXTS`, `Display`, and on request
//! `FromStr` and serde. Owns [`UnknownValue`], the refusal of a text that names no value.
//!
//! This crate must never depend on another crate (of the workspace or not), so that any crate
//! may use it; an enum that asks for serde derives it through its own crate's `serde`.
//!
//! ```
//! wire_enum::wire_enum! {
//!     /// How a door stands.
//!     pub enum Door {
//!         /// Nothing passes.
//!         Shut = "shut",
//!         HalfOpen = "half_open",
//!     }
//!     kind = "door";
//!     from_str;
//! }
//!
//! assert_eq!(Door::HalfOpen.as_str(), "half_open");
//! assert_eq!(Door::from_wire("shut"), Ok(Door::Shut));
//! assert_eq!("ajar".parse::<Door>().unwrap_err().to_string(),
//!            r#"unknown door "ajar" (expected one of shut, half_open)"#);
//! assert_eq!(Door::ALL, [Door::Shut, Door::HalfOpen]);
//! ```
//!
//! # Syntax
//!
//! ```text
//! wire_enum! {
//!     ATTRIBUTES                        // doc comments, #[derive(Default, PartialOrd, ...)]
//!     VIS enum NAME {
//!         VARIANT_ATTRIBUTES VARIANT = "text",   // doc comments, #[default]
//!         ...
//!     }
//!     OPTIONS                           // each ends in `;`, in any order, all optional
//! }
//! ```
//!
//! The enum always derives `Clone, Copy, PartialEq, Eq, Hash, Debug` (do not list them again);
//! other attributes are passed through. The options:
//!
//! - `kind = "name";` — what the enum spells, as a refusal names it (`unknown name "x"`).
//!   Without it, the type's name.
//! - `from_str;` — `impl FromStr` with [`UnknownValue`] as its error. `from_str(Error);` uses
//!   `Error` instead, which must implement `From<UnknownValue>`: a crate keeps its own error
//!   type and decides there what a refusal says. Leave the option out where a crate parses the
//!   text its own way (for instance a subset of the values) or does not parse it at all.
//! - `serde;` — derive `Serialize` and `Deserialize` (through the calling crate's `serde`),
//!   each variant renamed to its text, so serde and `as_str` cannot disagree.

#![forbid(unsafe_code)]

use std::fmt;

/// A text that names no value of a wire enum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownValue {
    /// What was being read: the enum's `kind` (for instance `command_kind`).
    pub kind: &'static str,
    /// The text as it was given.
    pub value: String,
    /// Every text that names a value, in declaration order.
    pub expected: &'static [&'static str],
}

impl UnknownValue {
    /// The refusal of `value` as a `kind` whose texts are `expected`.
    pub fn new(kind: &'static str, value: &str, expected: &'static [&'static str]) -> Self {
        UnknownValue {
            kind,
            value: value.to_owned(),
            expected,
        }
    }

    /// The accepted texts, comma-separated (`pooled, dedicated`).
    pub fn expected_list(&self) -> String {
        self.expected.join(", ")
    }
}

impl fmt::Display for UnknownValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown {} {:?} (expected one of {})",
            self.kind,
            self.value,
            self.expected_list()
        )
    }
}

impl std::error::Error for UnknownValue {}

/// Declares a closed enum with one wire text per variant; see the [crate] documentation.
#[macro_export]
macro_rules! wire_enum {
    (
        $(#[$attr:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vattr:meta])* $variant:ident = $text:literal ),+ $(,)?
        }
        $($options:tt)*
    ) => {
        $crate::__wire_enum! {
            @options [$($options)*]
            @kind [::core::stringify!($name)]
            @serde []
            @from_str []
            @enum [$(#[$attr])*] [$vis] $name [$( [$(#[$vattr])*] $variant $text )+]
        }
    };
}

/// The steps of [`wire_enum!`]: reads the options one by one, then writes the enum and its
/// impls. Not for direct use.
#[doc(hidden)]
#[macro_export]
macro_rules! __wire_enum {
    // One option at a time.
    (
        @options [kind = $kind:literal; $($rest:tt)*]
        @kind [$old:expr] @serde [$($serde:ident)?] @from_str [$($err:ty)?]
        @enum $($enum:tt)+
    ) => {
        $crate::__wire_enum! {
            @options [$($rest)*]
            @kind [$kind] @serde [$($serde)?] @from_str [$($err)?]
            @enum $($enum)+
        }
    };
    (
        @options [serde; $($rest:tt)*]
        @kind [$kind:expr] @serde [$($old:ident)?] @from_str [$($err:ty)?]
        @enum $($enum:tt)+
    ) => {
        $crate::__wire_enum! {
            @options [$($rest)*]
            @kind [$kind] @serde [serde] @from_str [$($err)?]
            @enum $($enum)+
        }
    };
    (
        @options [from_str; $($rest:tt)*]
        @kind [$kind:expr] @serde [$($serde:ident)?] @from_str [$($old:ty)?]
        @enum $($enum:tt)+
    ) => {
        $crate::__wire_enum! {
            @options [$($rest)*]
            @kind [$kind] @serde [$($serde)?] @from_str [$crate::UnknownValue]
            @enum $($enum)+
        }
    };
    (
        @options [from_str($error:ty); $($rest:tt)*]
        @kind [$kind:expr] @serde [$($serde:ident)?] @from_str [$($old:ty)?]
        @enum $($enum:tt)+
    ) => {
        $crate::__wire_enum! {
            @options [$($rest)*]
            @kind [$kind] @serde [$($serde)?] @from_str [$error]
            @enum $($enum)+
        }
    };

    // Every option read: the enum itself, without serde …
    (
        @options []
        @kind [$kind:expr] @serde [] @from_str [$($err:ty)?]
        @enum [$(#[$attr:meta])*] [$vis:vis] $name:ident
            [$( [$(#[$vattr:meta])*] $variant:ident $text:literal )+]
    ) => {
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
        $(#[$attr])*
        $vis enum $name {
            $( $(#[$vattr])* $variant, )+
        }

        $crate::__wire_enum! { @impls [$kind] [$($err)?] $name [$( $variant $text )+] }
    };
    // … or with serde, each variant renamed to its text.
    (
        @options []
        @kind [$kind:expr] @serde [serde] @from_str [$($err:ty)?]
        @enum [$(#[$attr:meta])*] [$vis:vis] $name:ident
            [$( [$(#[$vattr:meta])*] $variant:ident $text:literal )+]
    ) => {
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, ::serde::Serialize, ::serde::Deserialize)]
        $(#[$attr])*
        $vis enum $name {
            $( $(#[$vattr])* #[serde(rename = $text)] $variant, )+
        }

        $crate::__wire_enum! { @impls [$kind] [$($err)?] $name [$( $variant $text )+] }
    };

    // What every wire enum has.
    (@impls [$kind:expr] [$($err:ty)?] $name:ident [$( $variant:ident $text:literal )+]) => {
        #[allow(dead_code)]
        impl $name {
            /// What this enum spells, as a refusal of an unknown text names it.
            pub const KIND: &'static str = $kind;

            /// Every value, in declaration order.
            pub const ALL: [$name; [$($text),+].len()] = [$($name::$variant),+];

            /// Every value's wire text, in declaration order.
            pub const TEXTS: [&'static str; [$($text),+].len()] = [$($text),+];

            /// The wire text: how this value is written wherever it leaves the process.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// The value whose wire text is exactly `text`.
            pub fn from_wire(text: &str) -> ::core::result::Result<$name, $crate::UnknownValue> {
                match text {
                    $($text => ::core::result::Result::Ok($name::$variant),)+
                    _ => ::core::result::Result::Err($crate::UnknownValue::new(
                        $name::KIND,
                        text,
                        &$name::TEXTS,
                    )),
                }
            }
        }

        impl ::core::fmt::Display for $name {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        $(
            impl ::core::str::FromStr for $name {
                type Err = $err;

                fn from_str(text: &str) -> ::core::result::Result<$name, $err> {
                    $name::from_wire(text).map_err(<$err as ::core::convert::From<$crate::UnknownValue>>::from)
                }
            }
        )?
    };
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::str::FromStr;

    use super::UnknownValue;

    wire_enum! {
        /// A plain enum: no options at all.
        enum Bare {
            One = "one",
            Two = "two-words",
        }
    }

    wire_enum! {
        /// Every option, and attributes passed through.
        #[derive(Default, PartialOrd, Ord)]
        pub(crate) enum Full {
            /// The default.
            #[default]
            First = "first",
            SecondOne = "second_one",
            Third = "3rd",
        }
        serde;
        kind = "full_kind";
        from_str;
    }

    /// An error of the calling crate's own, built from the refusal.
    #[derive(Debug, PartialEq)]
    struct Refused(String);

    impl From<UnknownValue> for Refused {
        fn from(e: UnknownValue) -> Self {
            Refused(format!("{} is not a {}", e.value, e.kind))
        }
    }

    wire_enum! {
        enum Custom {
            A = "a",
        }
        from_str(Refused);
    }

    wire_enum! {
        /// Parsed by hand over `from_wire`: one value is written but never read back.
        enum Edge {
            Legacy = "legacy",
            OnFailure = "on-failure",
        }
        serde;
    }

    impl FromStr for Edge {
        type Err = ();
        fn from_str(text: &str) -> Result<Edge, ()> {
            match Edge::from_wire(text) {
                Ok(Edge::Legacy) | Err(_) => Err(()),
                Ok(edge) => Ok(edge),
            }
        }
    }

    #[test]
    fn a_crate_may_parse_the_texts_its_own_way() {
        assert_eq!("on-failure".parse::<Edge>(), Ok(Edge::OnFailure));
        assert_eq!("legacy".parse::<Edge>(), Err(()));
        assert_eq!(Edge::Legacy.to_string(), "legacy");
        assert_eq!(
            serde_json::to_string(&Edge::OnFailure).unwrap(),
            r#""on-failure""#
        );
    }

    #[test]
    fn each_value_is_written_and_read_back_as_its_one_text() {
        for (value, text) in Full::ALL.into_iter().zip(Full::TEXTS) {
            assert_eq!(value.as_str(), text);
            assert_eq!(value.to_string(), text);
            assert_eq!(Full::from_wire(text), Ok(value));
            assert_eq!(text.parse::<Full>(), Ok(value));
        }
        assert_eq!(Bare::Two.as_str(), "two-words");
        assert_eq!(Bare::ALL.len(), 2);
    }

    #[test]
    fn an_unknown_text_is_refused_naming_the_kind_and_every_accepted_text() {
        let e = Full::from_str("First").unwrap_err();
        assert_eq!(e.kind, "full_kind");
        assert_eq!(e.value, "First");
        assert_eq!(e.expected, ["first", "second_one", "3rd"]);
        assert_eq!(
            e.to_string(),
            r#"unknown full_kind "First" (expected one of first, second_one, 3rd)"#
        );
        assert_eq!(Bare::from_wire("three").unwrap_err().kind, "Bare");
    }

    #[test]
    fn from_str_may_answer_with_the_callers_own_error() {
        assert_eq!("a".parse::<Custom>(), Ok(Custom::A));
        assert_eq!(
            "b".parse::<Custom>(),
            Err(Refused("b is not a Custom".into()))
        );
    }

    #[test]
    fn serde_writes_and_reads_exactly_the_texts() {
        for value in Full::ALL {
            let json = serde_json::to_string(&value).unwrap();
            assert_eq!(json, format!("\"{}\"", value.as_str()));
            assert_eq!(serde_json::from_str::<Full>(&json).unwrap(), value);
        }
        let e = serde_json::from_str::<Full>("\"First\"").unwrap_err();
        assert!(
            e.to_string().starts_with(
                "unknown variant `First`, expected one of `first`, `second_one`, `3rd`"
            ),
            "{e}"
        );
    }

    #[test]
    fn the_derived_and_passed_through_traits_are_there() {
        assert_eq!(Full::default(), Full::First);
        assert!(Full::First < Full::Third);
        let set: HashSet<Full> = Full::ALL.into_iter().collect();
        assert_eq!(set.len(), 3);
        assert_eq!(format!("{:?}", Full::SecondOne), "SecondOne");
        const TEXT: &str = Full::Third.as_str();
        assert_eq!(TEXT, "3rd");
    }
}
