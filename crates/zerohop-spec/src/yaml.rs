//! The YAML walk every section's reader shares: a parsing context that makes errors with
//! the file, line and field, typed getters of a mapping's fields (each error names what was
//! expected and what to do), and how a key or a node is shown in messages.

use std::time::Duration;

use saphyr::{MarkedYaml, Scalar, YamlData};

use crate::*;

pub(crate) type Map<'a, 'y> = Vec<(&'a MarkedYaml<'y>, &'a MarkedYaml<'y>)>;

/// A mapping key as a field name: an empty key is shown quoted (`""`), so an error about it
/// still names a field.
pub(crate) fn shown_key(key: &str) -> &str {
    if key.is_empty() {
        "\"\""
    } else {
        key
    }
}

pub(crate) fn line(n: &MarkedYaml<'_>) -> usize {
    n.span.start.line()
}

/// The value of `key` in a mapping.
pub(crate) fn get<'a, 'y>(map: &Map<'a, 'y>, key: &str) -> Option<&'a MarkedYaml<'y>> {
    map.iter()
        .find(|(k, _)| scalar_text(k).as_deref() == Some(key))
        .map(|(_, v)| *v)
}

/// A scalar's text as written (strings, numbers and booleans alike); `None` for
/// collections and null.
pub(crate) fn scalar_text(n: &MarkedYaml<'_>) -> Option<String> {
    match &n.data {
        YamlData::Value(Scalar::String(s)) => Some(s.to_string()),
        YamlData::Value(Scalar::Integer(i)) => Some(i.to_string()),
        YamlData::Value(Scalar::FloatingPoint(f)) => Some(f.to_string()),
        YamlData::Value(Scalar::Boolean(b)) => Some(b.to_string()),
        YamlData::Representation(s, _, _) => Some(s.to_string()),
        _ => None,
    }
}

pub(crate) fn kind(n: &MarkedYaml<'_>) -> &'static str {
    match &n.data {
        YamlData::Value(Scalar::Null) => "nothing (null)",
        YamlData::Value(Scalar::String(_)) | YamlData::Representation(..) => "a string",
        YamlData::Value(Scalar::Integer(_)) => "a number",
        YamlData::Value(Scalar::FloatingPoint(_)) => "a number",
        YamlData::Value(Scalar::Boolean(_)) => "a boolean",
        YamlData::Sequence(_) => "a list",
        YamlData::Mapping(_) => "a mapping",
        YamlData::Tagged(..) => "a tagged value",
        YamlData::Alias(_) => "an alias",
        YamlData::BadValue => "an invalid value",
    }
}

/// Parsing context: the file name for messages.
pub(crate) struct Cx {
    pub(crate) file: String,
}

impl Cx {
    pub(crate) fn err(&self, line: usize, field: &str, message: impl Into<String>) -> SpecError {
        SpecError {
            file: self.file.clone(),
            line,
            field: field.to_owned(),
            message: message.into(),
        }
    }

    pub(crate) fn mapping<'a, 'y>(
        &self,
        n: &'a MarkedYaml<'y>,
        field: &str,
    ) -> Result<Map<'a, 'y>, SpecError> {
        match &n.data {
            YamlData::Mapping(m) => Ok(m.iter().collect()),
            _ => Err(self.err(
                line(n),
                field,
                format!(
                    "expected a mapping (`key: value` lines or `{{ ... }}`), found {}",
                    kind(n)
                ),
            )),
        }
    }

    pub(crate) fn sequence<'a, 'y>(
        &self,
        n: &'a MarkedYaml<'y>,
        field: &str,
    ) -> Result<&'a [MarkedYaml<'y>], SpecError> {
        match &n.data {
            YamlData::Sequence(s) => Ok(s),
            _ => Err(self.err(
                line(n),
                field,
                format!(
                    "expected a list (`[a, b]` or `- a` lines), found {}",
                    kind(n)
                ),
            )),
        }
    }

    pub(crate) fn string(&self, n: &MarkedYaml<'_>, field: &str) -> Result<String, SpecError> {
        match &n.data {
            YamlData::Value(Scalar::String(s)) => Ok(s.to_string()),
            YamlData::Representation(s, _, _) => Ok(s.to_string()),
            _ => Err(self.err(
                line(n),
                field,
                format!("expected a string, found {}", kind(n)),
            )),
        }
    }

    /// A string, number or boolean as text (environment values).
    pub(crate) fn text(&self, n: &MarkedYaml<'_>, field: &str) -> Result<String, SpecError> {
        scalar_text(n).ok_or_else(|| {
            self.err(
                line(n),
                field,
                format!("expected a string or number, found {}", kind(n)),
            )
        })
    }

    pub(crate) fn strings(
        &self,
        n: &MarkedYaml<'_>,
        field: &str,
    ) -> Result<Vec<String>, SpecError> {
        self.sequence(n, field)?
            .iter()
            .enumerate()
            .map(|(i, e)| self.string(e, &format!("{field}[{i}]")))
            .collect()
    }

    pub(crate) fn integer(
        &self,
        n: &MarkedYaml<'_>,
        field: &str,
        min: i64,
        max: i64,
    ) -> Result<i64, SpecError> {
        match &n.data {
            YamlData::Value(Scalar::Integer(i)) if (min..=max).contains(i) => Ok(*i),
            YamlData::Value(Scalar::Integer(i)) => Err(self.err(
                line(n),
                field,
                format!("{i} is out of range; use {min} to {max}"),
            )),
            _ => Err(self.err(
                line(n),
                field,
                format!("expected a whole number, found {}", kind(n)),
            )),
        }
    }

    pub(crate) fn boolean(&self, n: &MarkedYaml<'_>, field: &str) -> Result<bool, SpecError> {
        match &n.data {
            YamlData::Value(Scalar::Boolean(b)) => Ok(*b),
            _ => Err(self.err(
                line(n),
                field,
                format!("expected true or false, found {}", kind(n)),
            )),
        }
    }

    /// A byte size: a number of bytes, or a number with `B`, `KiB`, `MiB`, `GiB` (also `K`,
    /// `KB`, ... meaning the same powers of two).
    pub(crate) fn size(&self, n: &MarkedYaml<'_>, field: &str) -> Result<u64, SpecError> {
        let bad = |what: String| self.err(line(n), field, what);
        let text = match &n.data {
            YamlData::Value(Scalar::Integer(i)) if *i >= 0 => return Ok(*i as u64),
            _ => scalar_text(n).ok_or_else(|| {
                bad(format!(
                    "expected a size such as 65536 or 64KiB, found {}",
                    kind(n)
                ))
            })?,
        };
        parse_size(&text).ok_or_else(|| {
            bad(format!(
                "`{text}` is not a size; write bytes (65536) or a number with B, KiB, MiB or GiB (64KiB)"
            ))
        })
    }

    /// A duration: a number with `ms`, `s`, `m` or `h`.
    pub(crate) fn duration(&self, n: &MarkedYaml<'_>, field: &str) -> Result<Duration, SpecError> {
        let text = scalar_text(n).unwrap_or_default();
        parse_duration(&text).ok_or_else(|| {
            self.err(
                line(n),
                field,
                format!(
                    "`{text}` is not a duration; write a number with ms, s, m or h (10s, 500ms)"
                ),
            )
        })
    }

    pub(crate) fn only_known(
        &self,
        map: &Map<'_, '_>,
        prefix: &str,
        known: &[&str],
    ) -> Result<(), SpecError> {
        for (k, _) in map {
            let key = scalar_text(k).unwrap_or_else(|| kind(k).to_owned());
            if !known.contains(&key.as_str()) {
                return Err(self.err(
                    line(k),
                    &format!("{prefix}{}", shown_key(&key)),
                    format!("unknown field; known fields here: {}", known.join(", ")),
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn required<'a, 'y>(
        &self,
        parent: &MarkedYaml<'y>,
        map: &Map<'a, 'y>,
        key: &str,
        prefix: &str,
    ) -> Result<&'a MarkedYaml<'y>, SpecError> {
        get(map, key).ok_or_else(|| {
            self.err(
                line(parent),
                &format!("{prefix}{key}"),
                "missing; this field is required (see docs/spec.md)",
            )
        })
    }
}
