use super::*;

#[test]
fn routes_resolve_by_method_and_path() {
    for r in Route::ALL {
        assert_eq!(Route::from_pattern(r.method(), r.pattern()), Some(r));
        if r != Route::Product {
            assert_eq!(Route::lookup(r.method(), r.pattern()), Ok((r, None)));
        }
    }
    assert_eq!(
        Route::lookup("GET", "/product/OLJCESPC7Z"),
        Ok((Route::Product, Some("OLJCESPC7Z".to_owned())))
    );
    assert_eq!(
        Route::lookup("GET", "/product/a%20b"),
        Ok((Route::Product, Some("a b".to_owned())))
    );
    for (method, path, status) in [
        ("GET", "/nope", 404),
        ("GET", "/product/", 404),
        ("GET", "/product", 404),
        ("GET", "/product/a/b", 404),
        ("DELETE", "/cart", 405),
        ("POST", "/product/X", 405),
        ("GET", "/setCurrency", 405),
        ("POST", "/logout", 405),
    ] {
        let e = Route::lookup(method, path).unwrap_err();
        assert_eq!(e.status, status, "{method} {path}: {e}");
    }
    assert_eq!(Route::from_pattern("GET", "/product/X"), None);
    assert_eq!(Route::Product.to_string(), "GET /product/{id}");
}

#[test]
fn cookies_are_read_from_the_header() {
    let h = Some("shop_session-id=s1; shop_currency=\"EUR\";other=x");
    assert_eq!(cookie(h, SESSION_COOKIE), Some("s1"));
    assert_eq!(cookie(h, CURRENCY_COOKIE), Some("EUR"));
    assert_eq!(cookie(h, "other"), Some("x"));
    assert_eq!(cookie(h, "shop"), None);
    assert_eq!(cookie(None, SESSION_COOKIE), None);
    assert_eq!(cookie(Some("garbage"), "garbage"), None);
    let names: Vec<&str> = cookies(h).map(|(k, _)| k).collect();
    assert_eq!(names, [SESSION_COOKIE, CURRENCY_COOKIE, "other"]);
}

#[test]
fn json_only_when_accept_names_it() {
    assert!(wants_json(Some("application/json")));
    assert!(wants_json(Some("text/html, Application/JSON;q=0.9")));
    assert!(!wants_json(Some("text/html,*/*")));
    assert!(!wants_json(Some("application/jsonx")));
    assert!(!wants_json(None));
}

/// The `http:` routes of a chain spec, and the `headers` of its frontend.
fn spec_routes(file: &str) -> (Vec<String>, String) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let spec = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut routes = Vec::new();
    for line in spec.lines() {
        if let Some(rest) = line.trim().strip_prefix("- { http: ") {
            let (route, seq) = rest.split_once(',').expect("{ http: ..., sequence: ... }");
            assert_eq!(seq.trim(), "sequence: [frontend] }", "{file}: {line}");
            routes.push(route.trim().trim_matches('"').to_owned());
        }
    }
    let headers = spec
        .lines()
        .find_map(|l| l.trim().strip_prefix("headers: "))
        .unwrap_or_else(|| panic!("{file}: the frontend's headers"))
        .to_owned();
    (routes, headers)
}

#[test]
fn both_chain_specs_route_every_page_to_the_frontend() {
    let mut expected: Vec<String> = Route::ALL.iter().map(|r| r.to_string()).collect();
    expected.sort();
    for file in ["chain.yaml", "chain-polyglot.yaml"] {
        let (mut routes, headers) = spec_routes(file);
        routes.sort();
        assert_eq!(routes, expected, "{file}");
        assert_eq!(headers, format!("[{}]", HEADERS.join(", ")), "{file}");
    }
}
