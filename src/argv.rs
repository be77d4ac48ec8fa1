//! The one place a flag group becomes command-line arguments again: the argv the launcher
//! hands a rank (`tchrun-worker train|score|evaluate ...`) is derived from the parsed clap
//! group, not written by hand per flag.
//!
//! The names and kinds come from clap (`Args::augment_args`: each argument's long name, its
//! action `SetTrue`/`Set`/`Append`, its possible values, its conflicts); the values from the
//! group's `serde::Serialize` (field name = clap id). A field the group does not serialise
//! (`#[serde(skip)]`, or `skip_serializing_if` true) is not passed; `None` is not passed; a
//! `false` switch is not passed; a float is written `{:e}` (exact: Rust prints the shortest
//! string that parses back to the same bits); a struct value (`--affine D,T,S0,S1,SH`) is its
//! fields in order, joined by commas; an enum its clap value name ([`value_enum_serde!`]).
//! Every value is written `--name=value`, so one that starts with `-` stays a value.
//!
//! A positional argument's values come after the flags; a trailing one (`last = true`, `exec`'s
//! program) behind `--`. [`flag`] gives one flag of a group alone (a sweep run's `--output`);
//! [`named`] the one flag whose name is data (a sweep's `--param NAME=V`).
//!
//! [`argv`] passes every flag the group serialises; [`argv_changed`] only those whose value
//! differs from clap's default (the recipe and augmentation groups: a rank gets what the user
//! changed). Round trip: `parse(argv(x)) == x` (the property tests in `tests/props.rs`).
use clap::{ArgAction, Args, Command, FromArgMatches};
use serde::ser::{self, Impossible, Serialize};
use std::collections::HashMap;
use std::fmt::Display;

mod flag;
pub use flag::{args, Flag};

/// Why a group could not be turned into argv (a path that is not UTF-8, or a group whose
/// serde form does not match its clap form: a test finds the latter).
#[derive(Debug, thiserror::Error)]
pub enum ArgvError {
    #[error("--{flag}: {reason}")]
    Value { flag: String, reason: String },
    #[error("field `{0}` of a flag group is no flag (a flattened group needs #[serde(flatten)])")]
    NotAFlag(String),
    #[error("{0}")]
    Serde(String),
}

impl ser::Error for ArgvError {
    fn custom<T: Display>(msg: T) -> Self {
        ArgvError::Serde(msg.to_string())
    }
}

/// The serialised value of one field, as argv sees it.
#[derive(Debug, Clone, PartialEq)]
enum Rendered {
    Absent,
    Switch(bool),
    One(String),
    Many(Vec<String>),
}

/// Every flag of `value` that it serialises, as `--name=value` (a switch: `--name`), in clap's
/// declaration order.
pub fn argv<T: Args + Serialize>(value: &T) -> Result<Vec<String>, ArgvError> {
    Ok(args(&flags(value)?))
}

/// Like [`argv`], but only the flags whose value differs from clap's default (read with no
/// `TCHRUN_*` variable: the default of the declaration).
pub fn argv_changed<T: Args + FromArgMatches + Serialize>(
    value: &T,
) -> Result<Vec<String>, ArgvError> {
    Ok(args(&flags_changed(value)?))
}

/// [`argv`]'s flags, typed.
pub fn flags<T: Args + Serialize>(value: &T) -> Result<Vec<Flag>, ArgvError> {
    let cmd = T::augment_args(Command::new("argv"));
    render(&cmd, fields(value)?, None)
}

/// [`argv_changed`]'s flags, typed.
pub fn flags_changed<T: Args + FromArgMatches + Serialize>(
    value: &T,
) -> Result<Vec<Flag>, ArgvError> {
    let cmd = T::augment_args(Command::new("argv")).mut_args(|a| a.env(None::<&str>));
    let matches = cmd
        .clone()
        .try_get_matches_from(["argv"])
        .map_err(|e| ArgvError::Serde(e.to_string()))?;
    let defaults = T::from_arg_matches(&matches).map_err(|e| ArgvError::Serde(e.to_string()))?;
    render(&cmd, fields(value)?, Some(fields(&defaults)?))
}

/// The clap value name of a `ValueEnum` variant (what `--flag=NAME` takes).
pub fn value_name<E: clap::ValueEnum>(e: &E) -> String {
    e.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}

/// `serde::Serialize` and `Deserialize` of `ValueEnum`s as their clap value names: one
/// spelling for the flag, the argv and the records.
#[macro_export]
macro_rules! value_enum_serde {
    ($($t:ty),* $(,)?) => {$(
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&$crate::argv::value_name(self))
            }
        }
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <String as serde::Deserialize>::deserialize(d)?;
                <$t as clap::ValueEnum>::from_str(&s, false).map_err(serde::de::Error::custom)
            }
        }
    )*};
}

fn fields<T: Serialize>(value: &T) -> Result<Vec<(String, Rendered)>, ArgvError> {
    let mut f = Fields(Vec::new());
    value.serialize(&mut f)?;
    Ok(f.0)
}

fn render(
    cmd: &Command,
    fields: Vec<(String, Rendered)>,
    defaults: Option<Vec<(String, Rendered)>>,
) -> Result<Vec<Flag>, ArgvError> {
    let ids: Vec<&str> = cmd.get_arguments().map(|a| a.get_id().as_str()).collect();
    if let Some((name, _)) = fields.iter().find(|(n, _)| !ids.contains(&n.as_str())) {
        return Err(ArgvError::NotAFlag(name.clone()));
    }
    let values: HashMap<String, Rendered> = fields.into_iter().collect();
    let defaults: Option<HashMap<String, Rendered>> = defaults.map(|d| d.into_iter().collect());
    let mut per_arg: Vec<(&clap::Arg, Vec<Flag>)> = Vec::new();
    for arg in cmd.get_arguments() {
        let Some(r) = values.get(arg.get_id().as_str()) else {
            continue;
        };
        let t = tokens(arg, r)?;
        let at_default = defaults.as_ref().is_some_and(|d| {
            let dr = d.get(arg.get_id().as_str()).unwrap_or(&Rendered::Absent);
            tokens(arg, dr).ok().as_ref() == Some(&t)
        });
        if !at_default {
            per_arg.push((arg, t));
        }
    }
    // A flag with a default that conflicts with one given is left at its default: the rank
    // gets the given one alone (`--no-channels-last` without `--channels-last=auto`).
    let explicit = |a: &clap::Arg| {
        matches!(a.get_action(), ArgAction::SetTrue) || a.get_default_values().is_empty()
    };
    let given = |id: &clap::Id| {
        per_arg
            .iter()
            .any(|(a, t)| a.get_id() == id && !t.is_empty() && explicit(a))
    };
    let mut out = Vec::new();
    let mut positional = Vec::new();
    for (arg, t) in &per_arg {
        if arg.is_positional() {
            // After the flags; a trailing list (`last = true`) behind `--`.
            if arg.is_last_set() && !t.is_empty() {
                positional.push(Flag::Plain("--".to_string()));
            }
            positional.extend(t.iter().cloned());
            continue;
        }
        let conflicted = !explicit(arg)
            && cmd.get_arguments().any(|other| {
                given(other.get_id())
                    && (cmd.get_arg_conflicts_with(other).contains(arg)
                        || cmd.get_arg_conflicts_with(arg).contains(&other))
            });
        if !conflicted {
            out.extend(t.iter().cloned());
        }
    }
    out.extend(positional);
    Ok(out)
}

/// The argument(s) of one flag of group `T` (clap id `id`, its field name) holding `value`:
/// for a command line that names a group's flag alone (a sweep run's `--output`).
pub fn flag<T: Args, V: Serialize + ?Sized>(id: &str, value: &V) -> Result<Vec<String>, ArgvError> {
    let cmd = T::augment_args(Command::new("argv"));
    let arg = cmd
        .get_arguments()
        .find(|a| a.get_id().as_str() == id)
        .ok_or_else(|| ArgvError::NotAFlag(id.to_string()))?;
    let r = value.serialize(ValueSer)?;
    Ok(args(&tokens(arg, &r)?))
}

/// `--NAME=VALUE` for a flag whose name is data, not a field (a sweep's `--param NAME=V`,
/// checked later by the parser of the command that receives it).
pub fn named(name: &str, value: &str) -> String {
    format!("--{name}={value}")
}

/// The flags of one argument holding `r` (none, one, or one per value of a list; a positional
/// argument: its values).
fn tokens(arg: &clap::Arg, r: &Rendered) -> Result<Vec<Flag>, ArgvError> {
    if arg.is_positional() {
        let plain = |v: &[String]| v.iter().cloned().map(Flag::Plain).collect();
        return match r {
            Rendered::Absent => Ok(Vec::new()),
            Rendered::One(s) => Ok(vec![Flag::Plain(s.clone())]),
            Rendered::Many(v) => Ok(plain(v)),
            Rendered::Switch(b) => Ok(vec![Flag::Plain(b.to_string())]),
        };
    }
    let long = arg.get_long().unwrap_or_else(|| arg.get_id().as_str());
    let bad = |reason: String| ArgvError::Value {
        flag: long.to_string(),
        reason,
    };
    let flag = |value: Option<String>| Flag::Named {
        name: long.to_string(),
        value,
    };
    let check = |s: &str| {
        let pv = arg.get_possible_values();
        if pv.is_empty() || pv.iter().any(|p| p.matches(s, false)) {
            Ok(flag(Some(s.to_string())))
        } else {
            Err(bad(format!("'{s}' is none of its values")))
        }
    };
    match (arg.get_action(), r) {
        (_, Rendered::Absent) => Ok(Vec::new()),
        (ArgAction::SetTrue, Rendered::Switch(on)) => {
            Ok(if *on { vec![flag(None)] } else { Vec::new() })
        }
        (ArgAction::Set, Rendered::Switch(b)) => Ok(vec![check(&b.to_string())?]),
        (ArgAction::Set | ArgAction::Append, Rendered::One(s)) => Ok(vec![check(s)?]),
        (ArgAction::Append, Rendered::Many(v)) => v.iter().map(|s| check(s)).collect(),
        (ArgAction::Set, Rendered::Many(v)) => match arg.get_value_delimiter() {
            Some(d) => Ok(vec![check(&v.join(&d.to_string()))?]),
            None => Err(bad("a list for a flag that takes one value".into())),
        },
        (action, r) => Err(bad(format!("{r:?} for a flag of action {action:?}"))),
    }
}

/// The top-level serializer: a group's fields (a flattened group's through `serialize_map`).
struct Fields(Vec<(String, Rendered)>);

fn unsupported<T>(what: &str) -> Result<T, ArgvError> {
    Err(ArgvError::Serde(format!("a flag group cannot be {what}")))
}

impl Fields {
    fn push<V: Serialize + ?Sized>(&mut self, key: &str, value: &V) -> Result<(), ArgvError> {
        let r = value.serialize(ValueSer).map_err(|e| ArgvError::Value {
            flag: key.replace('_', "-"),
            reason: e.to_string(),
        })?;
        self.0.push((key.to_string(), r));
        Ok(())
    }
}

impl ser::SerializeStruct for &mut Fields {
    type Ok = ();
    type Error = ArgvError;
    fn serialize_field<V: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &V,
    ) -> Result<(), ArgvError> {
        self.push(key, value)
    }
    fn end(self) -> Result<(), ArgvError> {
        Ok(())
    }
}

impl ser::SerializeMap for &mut Fields {
    type Ok = ();
    type Error = ArgvError;
    fn serialize_key<K: Serialize + ?Sized>(&mut self, _: &K) -> Result<(), ArgvError> {
        unsupported("a map without entries")
    }
    fn serialize_value<V: Serialize + ?Sized>(&mut self, _: &V) -> Result<(), ArgvError> {
        unsupported("a map without entries")
    }
    fn serialize_entry<K: Serialize + ?Sized, V: Serialize + ?Sized>(
        &mut self,
        key: &K,
        value: &V,
    ) -> Result<(), ArgvError> {
        match key.serialize(ValueSer)? {
            Rendered::One(k) => self.push(&k, value),
            other => Err(ArgvError::Serde(format!("a field named {other:?}"))),
        }
    }
    fn end(self) -> Result<(), ArgvError> {
        Ok(())
    }
}

macro_rules! not_a_group {
    ($($f:ident($($t:ty),*)),* $(,)?) => {$(
        fn $f(self, $(_: $t),*) -> Result<(), ArgvError> {
            unsupported(stringify!($f))
        }
    )*};
}

impl<'a> ser::Serializer for &'a mut Fields {
    type Ok = ();
    type Error = ArgvError;
    type SerializeSeq = Impossible<(), ArgvError>;
    type SerializeTuple = Impossible<(), ArgvError>;
    type SerializeTupleStruct = Impossible<(), ArgvError>;
    type SerializeTupleVariant = Impossible<(), ArgvError>;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Impossible<(), ArgvError>;
    not_a_group!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_f32(f32),
        serialize_f64(f64),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8]),
        serialize_none(),
        serialize_unit(),
        serialize_unit_struct(&'static str),
        serialize_unit_variant(&'static str, u32, &'static str),
    );
    fn serialize_some<V: Serialize + ?Sized>(self, _: &V) -> Result<(), ArgvError> {
        unsupported("an option")
    }
    fn serialize_newtype_struct<V: Serialize + ?Sized>(
        self,
        _: &'static str,
        v: &V,
    ) -> Result<(), ArgvError> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<V: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &V,
    ) -> Result<(), ArgvError> {
        unsupported("an enum")
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, ArgvError> {
        unsupported("a list")
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, ArgvError> {
        unsupported("a tuple")
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, ArgvError> {
        unsupported("a tuple")
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, ArgvError> {
        unsupported("an enum")
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self, ArgvError> {
        Ok(self)
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, ArgvError> {
        Ok(self)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, ArgvError> {
        unsupported("an enum")
    }
}

/// One field's value: a scalar, a list (`Append`), or a struct/tuple joined by commas.
struct ValueSer;

/// The parts of a list or of a comma-joined struct.
struct Parts {
    items: Vec<String>,
    joined: bool,
}

impl Parts {
    fn add<V: Serialize + ?Sized>(&mut self, v: &V) -> Result<(), ArgvError> {
        match v.serialize(ValueSer)? {
            Rendered::One(s) => self.items.push(s),
            Rendered::Switch(b) => self.items.push(b.to_string()),
            other => return Err(ArgvError::Serde(format!("{other:?} inside a value"))),
        }
        Ok(())
    }
    fn done(self) -> Result<Rendered, ArgvError> {
        Ok(if self.joined {
            Rendered::One(self.items.join(","))
        } else {
            Rendered::Many(self.items)
        })
    }
}

impl ser::SerializeSeq for Parts {
    type Ok = Rendered;
    type Error = ArgvError;
    fn serialize_element<V: Serialize + ?Sized>(&mut self, v: &V) -> Result<(), ArgvError> {
        self.add(v)
    }
    fn end(self) -> Result<Rendered, ArgvError> {
        self.done()
    }
}

impl ser::SerializeTuple for Parts {
    type Ok = Rendered;
    type Error = ArgvError;
    fn serialize_element<V: Serialize + ?Sized>(&mut self, v: &V) -> Result<(), ArgvError> {
        self.add(v)
    }
    fn end(self) -> Result<Rendered, ArgvError> {
        self.done()
    }
}

impl ser::SerializeTupleStruct for Parts {
    type Ok = Rendered;
    type Error = ArgvError;
    fn serialize_field<V: Serialize + ?Sized>(&mut self, v: &V) -> Result<(), ArgvError> {
        self.add(v)
    }
    fn end(self) -> Result<Rendered, ArgvError> {
        self.done()
    }
}

impl ser::SerializeStruct for Parts {
    type Ok = Rendered;
    type Error = ArgvError;
    fn serialize_field<V: Serialize + ?Sized>(
        &mut self,
        _: &'static str,
        v: &V,
    ) -> Result<(), ArgvError> {
        self.add(v)
    }
    fn end(self) -> Result<Rendered, ArgvError> {
        self.done()
    }
}

macro_rules! one {
    ($($f:ident($t:ty) => $fmt:literal),* $(,)?) => {$(
        fn $f(self, v: $t) -> Result<Rendered, ArgvError> {
            Ok(Rendered::One(format!($fmt, v)))
        }
    )*};
}

impl ser::Serializer for ValueSer {
    type Ok = Rendered;
    type Error = ArgvError;
    type SerializeSeq = Parts;
    type SerializeTuple = Parts;
    type SerializeTupleStruct = Parts;
    type SerializeTupleVariant = Impossible<Rendered, ArgvError>;
    type SerializeMap = Impossible<Rendered, ArgvError>;
    type SerializeStruct = Parts;
    type SerializeStructVariant = Impossible<Rendered, ArgvError>;
    one!(
        serialize_i8(i8) => "{}",
        serialize_i16(i16) => "{}",
        serialize_i32(i32) => "{}",
        serialize_i64(i64) => "{}",
        serialize_u8(u8) => "{}",
        serialize_u16(u16) => "{}",
        serialize_u32(u32) => "{}",
        serialize_u64(u64) => "{}",
        serialize_f32(f32) => "{:e}",
        serialize_f64(f64) => "{:e}",
        serialize_char(char) => "{}",
        serialize_str(&str) => "{}",
    );
    fn serialize_bool(self, v: bool) -> Result<Rendered, ArgvError> {
        Ok(Rendered::Switch(v))
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<Rendered, ArgvError> {
        unsupported("bytes")
    }
    fn serialize_none(self) -> Result<Rendered, ArgvError> {
        Ok(Rendered::Absent)
    }
    fn serialize_some<V: Serialize + ?Sized>(self, v: &V) -> Result<Rendered, ArgvError> {
        v.serialize(self)
    }
    fn serialize_unit(self) -> Result<Rendered, ArgvError> {
        Ok(Rendered::Absent)
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<Rendered, ArgvError> {
        Ok(Rendered::Absent)
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<Rendered, ArgvError> {
        Ok(Rendered::One(variant.to_string()))
    }
    fn serialize_newtype_struct<V: Serialize + ?Sized>(
        self,
        _: &'static str,
        v: &V,
    ) -> Result<Rendered, ArgvError> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<V: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &V,
    ) -> Result<Rendered, ArgvError> {
        unsupported("an enum with data (give it a string Serialize)")
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Parts, ArgvError> {
        Ok(Parts {
            items: Vec::new(),
            joined: false,
        })
    }
    fn serialize_tuple(self, _: usize) -> Result<Parts, ArgvError> {
        Ok(Parts {
            items: Vec::new(),
            joined: true,
        })
    }
    fn serialize_tuple_struct(self, _: &'static str, n: usize) -> Result<Parts, ArgvError> {
        self.serialize_tuple(n)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, ArgvError> {
        unsupported("an enum with data")
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, ArgvError> {
        unsupported("a map")
    }
    fn serialize_struct(self, _: &'static str, n: usize) -> Result<Parts, ArgvError> {
        self.serialize_tuple(n)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, ArgvError> {
        unsupported("an enum with data")
    }
}
