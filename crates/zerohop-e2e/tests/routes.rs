//! HTTP routes as users write them: path parameters, a catch-all, the most specific route
//! winning, the query string and cookies reaching functions, and the headers, status and
//! content type functions answer with. Driven with curl.

mod common;

use common::curl::curl;
use common::func;
use zerohop_test_support::ChainProcess;

fn spec() -> String {
    let echo_env = "TESTFN_PARAMS: \"id,rest\", TESTFN_QUERY: \"q,n\", TESTFN_COOKIES: \"shop_session-id,shop_currency\"";
    let top_env = "TESTFN_STATUS: \"303\", TESTFN_RESPONSE: \"location=/cart|set-cookie=a=1; Path=/|set-cookie=b=2|content-type=text/x-top\"";
    format!(
        "name: routes\nfunctions:\n{}{}{}routes:\n  \
         - http: GET /product/{{id}}\n    sequence: [echo]\n    content_type: application/json\n  \
         - {{ http: \"POST /product/{{id}}\", sequence: [echo] }}\n  \
         - http: GET /product/top\n    sequence: [top]\n  \
         - http: GET /static/*\n    sequence: [echo]\n  \
         - {{ http: GET /, sequence: [plain] }}\n",
        func(
            "echo",
            "request",
            echo_env,
            ", headers: [\":path\", \":query\", Cookie]"
        ),
        func("top", "request", top_env, ""),
        func("plain", "request", "", ""),
    )
}

#[test]
fn parameters_a_catch_all_the_query_and_cookies_reach_functions() {
    let chain = ChainProcess::start(&spec(), &[]);
    let url = &chain.url;

    let a = curl(&[
        "-b",
        "shop_session-id=s-42; shop_currency=EUR",
        &format!("{url}/product/OLJCESPC7Z?q=caf%C3%A9&n=1"),
    ]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        a.body,
        "path=/product/OLJCESPC7Z\nroute=/product/{id}\nquery=q=caf%C3%A9&n=1\n\
         param.id=OLJCESPC7Z\nparam.rest=-\nquery.q=café\nquery.n=1\n\
         cookie.shop_session-id=s-42\ncookie.shop_currency=EUR\n"
    );
    assert_eq!(
        a.header("content-type"),
        ["application/json"],
        "the route's type"
    );

    // Parameters are percent-decoded; the path stays as sent.
    let a = curl(&["-X", "POST", "-d", "x", &format!("{url}/product/a%20b")]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.body.starts_with("path=/product/a%20b\n"), "{}", a.body);
    assert!(a.body.contains("param.id=a b\n"), "{}", a.body);
    assert!(
        a.header("content-type").is_empty(),
        "POST's route sets no type"
    );

    // The catch-all takes the rest of the path, slashes included.
    let a = curl(&[&format!("{url}/static/css/site.css")]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.body.contains("route=/static/{*rest}\n"), "{}", a.body);
    assert!(a.body.contains("param.rest=css/site.css\n"), "{}", a.body);

    // What one function of the chain lists reaches them all.
    let a = curl(&[&format!("{url}/?x=1")]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(
        a.body.starts_with("path=/\nroute=/\nquery=x=1\n"),
        "{}",
        a.body
    );

    // 404 and 405 still told apart, with parameters.
    let a = curl(&[&format!("{url}/product/1/more")]);
    assert_eq!(a.status, 404, "{}", a.body);
    let a = curl(&["-X", "DELETE", &format!("{url}/product/1")]);
    assert_eq!(a.status, 405, "{}", a.body);
    assert_eq!(a.header("allow"), ["GET, POST, HEAD"]);
    // HEAD runs the GET route and gets its headers, no body.
    let a = curl(&["-I", &format!("{url}/product/7")]);
    assert_eq!((a.status, a.body.as_str()), (200, ""));
    assert_eq!(a.header("content-type"), ["application/json"]);
    // Cookies an HTTP/2 client splits over several fields arrive as one list.
    let a = curl(&[
        "--http2-prior-knowledge",
        "-H",
        "cookie: shop_session-id=s-9",
        "-H",
        "cookie: shop_currency=JPY",
        &format!("{url}/product/7"),
    ]);
    assert!(
        a.body
            .contains("cookie.shop_session-id=s-9\ncookie.shop_currency=JPY\n"),
        "{}",
        a.body
    );
    // A parameter that decodes to a line break cannot forge a metadata line.
    let a = curl(&[&format!("{url}/product/a%0Ab")]);
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(
        a.body.contains("path parameter `id` holds a line break"),
        "{}",
        a.body
    );
    assert_eq!(chain.stop(), Some(0));
}

#[test]
fn the_most_specific_route_wins_and_functions_set_status_and_headers() {
    let chain = ChainProcess::start(&spec(), &[]);
    let a = curl(&[&format!("{}/product/top", chain.url)]);
    assert_eq!(
        a.status, 303,
        "the literal route beats `{{id}}`: {}",
        a.body
    );
    assert_eq!(a.header("location"), ["/cart"]);
    assert_eq!(a.header("set-cookie"), ["a=1; Path=/", "b=2"]);
    assert_eq!(
        a.header("content-type"),
        ["text/x-top"],
        "the function's own type"
    );
    assert!(a.body.starts_with("path=/product/top\n"), "{}", a.body);
    assert_eq!(chain.stop(), Some(0));
}

#[test]
fn cloudevents_arrive_alike_in_binary_and_structured_mode_and_answer_in_kind() {
    let spec = format!(
        "name: events\nfunctions:\n{}routes:\n  - {{ http: POST /events, sequence: [on_event] }}\n",
        func(
            "on_event",
            "request",
            "TESTFN_RESPONSE: \"ce-type=order.seen|ce-source=/zerohop|ce-id=a1|content-type=text/plain\"",
            ", headers: [ce-type, ce-source, content-type]"
        ),
    );
    // The function answers with the `ce-type` it saw, and with an event of its own.
    let spec = spec.replace(
        "TESTFN_MODE: request",
        "TESTFN_MODE: header, TESTFN_HEADER: ce-type",
    );
    let chain = ChainProcess::start(&spec, &[]);
    let url = format!("{}/events", chain.url);

    // Binary mode: attributes are headers; the answer's ce-* headers come back as they are.
    let a = curl(&[
        "-H",
        "ce-specversion: 1.0",
        "-H",
        "ce-type: order.created",
        "-H",
        "ce-source: /shop",
        "-H",
        "ce-id: 7",
        "-H",
        "content-type: application/json",
        "--data",
        "{\"order\":7}",
        &url,
    ]);
    assert_eq!((a.status, a.body.as_str()), (200, "order.created"));
    assert_eq!(a.header("ce-type"), ["order.seen"]);
    assert_eq!(a.header("content-type"), ["text/plain"]);

    // Structured mode: the same function sees the same; the answer is a structured event.
    let a = curl(&[
        "-H",
        "content-type: application/cloudevents+json",
        "--data",
        r#"{"specversion":"1.0","type":"order.created","source":"/shop","id":"7","datacontenttype":"application/json","data":{"order":7}}"#,
        &url,
    ]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        a.header("content-type"),
        ["application/cloudevents+json; charset=utf-8"]
    );
    let event: serde_json::Value = serde_json::from_str(&a.body).expect("a JSON event");
    assert_eq!(event["type"], "order.seen");
    assert_eq!(event["id"], "a1");
    assert_eq!(event["specversion"], "1.0");
    // The function answered with the type it saw, as text.
    assert_eq!(event["data"], "order.created", "{event}");
    assert_eq!(event["datacontenttype"], "text/plain");

    let a = curl(&[
        "-H",
        "content-type: application/cloudevents+json",
        "--data",
        r#"{"type":"x"}"#,
        &url,
    ]);
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(a.body.contains("no specversion"), "{}", a.body);
    let a = curl(&[
        "-H",
        "content-type: application/cloudevents-batch+json",
        "--data",
        "[]",
        &url,
    ]);
    assert_eq!(a.status, 415, "{}", a.body);
    assert_eq!(chain.stop(), Some(0));
}
