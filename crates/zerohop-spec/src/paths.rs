//! HTTP route paths: literal segments, parameters (`{id}`), a trailing catch-all (`{*rest}`,
//! or `*` for `{*rest}`), and which routes of one method would be ambiguous.
//!
//! The gateway matches with the same router ([`matchit`]), so what passes here is exactly
//! what it can tell apart: at each segment a literal wins over a parameter, and a parameter
//! over a catch-all ("the most specific route wins"). Two routes of one method that differ
//! only in their parameters' names (`/a/{x}` and `/a/{y}`) are ambiguous, and an error; so
//! are a parameter and a catch-all at the same place (`/a/{x}` and `/a/{*rest}`), which the
//! router cannot order.

use std::collections::HashMap;

/// `path` (after the method) as the plan keeps it: checked, with `*` written `{*rest}`; or
/// why it is not a route path.
pub(crate) fn pattern(path: &str) -> Result<String, String> {
    if !path.starts_with('/') {
        return Err("a path starts with `/`".into());
    }
    if let Some(c) = path
        .chars()
        .find(|c| c.is_whitespace() || *c == '?' || *c == '#')
    {
        return Err(format!(
            "`{}` has no place in a route path (the query string is not part of the route; \
             functions read it with `:query`)",
            c.escape_default()
        ));
    }
    let segments: Vec<&str> = path[1..].split('/').collect();
    let mut names: Vec<&str> = Vec::new();
    let mut out = String::new();
    for (i, seg) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        out.push('/');
        let name = if *seg == "*" {
            out.push_str("{*rest}");
            Some(("rest", true))
        } else if let Some(inner) = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            let (name, all) = match inner.strip_prefix('*') {
                Some(n) => (n, true),
                None => (inner, false),
            };
            if !is_name(name) {
                return Err(format!(
                    "`{seg}`: a parameter's name is letters, digits and `_`, not starting with a \
                     digit (e.g. `{{id}}`)"
                ));
            }
            out.push_str(seg);
            Some((name, all))
        } else {
            if seg.contains(['{', '}', '*']) {
                return Err(format!(
                    "segment `{seg}`: `{{`, `}}` and `*` only make whole segments: `{{name}}`, \
                     `{{*name}}` or `*`"
                ));
            }
            out.push_str(seg);
            None
        };
        if let Some((name, all)) = name {
            if all && !last {
                return Err(format!(
                    "`{seg}` matches the rest of the path, so it must be the last segment"
                ));
            }
            if names.contains(&name) {
                return Err(format!("parameter `{name}` appears twice"));
            }
            names.push(name);
        }
    }
    Ok(out)
}

/// A parameter name: `[A-Za-z_][A-Za-z0-9_]*`, at most 64 bytes.
fn is_name(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
        && s.len() <= 64
}

/// The routes of each method so far, to find the ambiguous ones.
#[derive(Default)]
pub(crate) struct Ambiguity {
    by_method: HashMap<String, (matchit::Router<usize>, HashMap<String, usize>)>,
}

impl Ambiguity {
    /// Adds route `index` (`method pattern`); the index of an earlier route it cannot be told
    /// apart from, and why, if there is one.
    pub(crate) fn add(
        &mut self,
        method: &str,
        pattern: &str,
        index: usize,
    ) -> Result<(), (usize, String)> {
        let (router, patterns) = self.by_method.entry(method.to_owned()).or_default();
        if let Some(&earlier) = patterns.get(pattern) {
            return Err((earlier, format!("`{method} {pattern}` is already routed")));
        }
        match router.insert(pattern, index) {
            Ok(()) => {
                patterns.insert(pattern.to_owned(), index);
                Ok(())
            }
            Err(e) => {
                let with = match &e {
                    matchit::InsertError::Conflict { with } => patterns.get(with).copied(),
                    _ => None,
                };
                let earlier = with.unwrap_or_else(|| patterns.values().copied().min().unwrap_or(0));
                Err((
                    earlier,
                    format!(
                        "`{method} {pattern}` cannot be told apart from an earlier route ({e}); \
                         give parameters at the same place the same name, or make one path \
                         more specific"
                    ),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_are_checked_and_star_is_a_catch_all_named_rest() {
        assert_eq!(pattern("/hello").unwrap(), "/hello");
        assert_eq!(pattern("/").unwrap(), "/");
        assert_eq!(pattern("/product/{id}").unwrap(), "/product/{id}");
        assert_eq!(pattern("/api/*").unwrap(), "/api/{*rest}");
        assert_eq!(pattern("/files/{*path}").unwrap(), "/files/{*path}");
        for bad in [
            "hello",
            "/a b",
            "/a?x=1",
            "/a/{id",
            "/a/x{id}",
            "/a/{1d}",
            "/a/{}",
            "/a/*/b",
            "/a/{*rest}/b",
            "/a/{id}/{id}",
            "/a/**",
        ] {
            assert!(pattern(bad).is_err(), "{bad} passed");
        }
    }

    #[test]
    fn routes_differing_only_in_parameter_names_are_ambiguous_per_method() {
        let mut a = Ambiguity::default();
        a.add("GET", "/a/{x}", 0).unwrap();
        a.add("GET", "/a/b", 1).unwrap();
        a.add("GET", "/b/{*rest}", 2).unwrap();
        a.add("GET", "/b/c/d", 6).unwrap();
        a.add("POST", "/a/{y}", 3).unwrap();
        let (earlier, why) = a.add("GET", "/a/{y}", 4).unwrap_err();
        assert_eq!(earlier, 0, "{why}");
        let (earlier, _) = a.add("GET", "/a/b", 5).unwrap_err();
        assert_eq!(earlier, 1);
        // A parameter and a catch-all at the same place: the router cannot order them.
        let (earlier, _) = a.add("GET", "/a/{*rest}", 7).unwrap_err();
        assert_eq!(earlier, 0);
    }
}
