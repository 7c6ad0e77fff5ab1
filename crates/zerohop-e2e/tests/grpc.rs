//! gRPC unary routes with real gRPC clients: `examples/grpc` (greeter.proto, its chain and
//! its Rust function) under the real `zerohop up`, called by grpcurl (in clear by h2c, and
//! over TLS with a test CA) and by a Python grpcio client whose stubs grpcio-tools makes
//! from the same `.proto`. Errors are asserted as the clients see them: a function's 404 is
//! NOT_FOUND with its message, an unknown method and a streaming call UNIMPLEMENTED, a
//! compressed message UNIMPLEMENTED.
//!
//! The clients are installed once per checkout into `target/`: grpcurl built from the Go
//! module proxy at [`GRPCURL_VERSION`] (`target/grpcurl/bin`, a stamp names the version; the
//! Go caches are removed after the build, as `cargo xtask kube` does), grpcio and grpcio-tools
//! from PyPI into the venv `target/grpcio-venv`. Every wait is bounded; every process is
//! stopped by a guard, also on failure.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use zerohop_test_support::{ChainProcess, ChildGuard, TempDir};

/// The grpcurl release the tests build.
const GRPCURL_VERSION: &str = "v1.9.3";
/// Longest a client's build or install may take.
const INSTALL_WAIT: Duration = Duration::from_secs(900);
/// Longest one client call may take.
const CALL_WAIT: Duration = Duration::from_secs(30);
const SAY_HELLO: &str = "zerohop.example.Greeter/SayHello";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn example(file: &str) -> PathBuf {
    root().join("examples/grpc").join(file)
}

/// Runs `cmd` with no input to its end within `timeout`: exit code, standard output, standard
/// error.
fn run(cmd: &mut Command, timeout: Duration) -> (Option<i32>, String, String) {
    let mut guard = ChildGuard::new(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}")),
    );
    let read = |p: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut p) = p {
                let _ = p.read_to_string(&mut s);
            }
            s
        })
    };
    let out = read(guard.child_mut().stdout.take().map(|p| Box::new(p) as _));
    let err = read(guard.child_mut().stderr.take().map(|p| Box::new(p) as _));
    let code = guard.wait_timeout(timeout);
    (code, out.join().unwrap(), err.join().unwrap())
}

/// Runs `cmd` within [`INSTALL_WAIT`]; panics naming `what` with its output if it fails.
fn install_step(what: &str, cmd: &mut Command) {
    let (code, out, err) = run(cmd, INSTALL_WAIT);
    let tail = |s: &str| s.lines().rev().take(30).collect::<Vec<_>>().join("\n");
    assert_eq!(
        code,
        Some(0),
        "{what} failed:\n{}\n{}",
        tail(&out),
        tail(&err)
    );
}

/// grpcurl, built from the Go module proxy once per checkout into `target/grpcurl/bin`.
fn grpcurl() -> &'static Path {
    static GRPCURL: OnceLock<PathBuf> = OnceLock::new();
    GRPCURL.get_or_init(|| {
        let dir = root().join("target/grpcurl");
        let bin = dir.join("bin/grpcurl");
        let stamp = dir.join("bin/VERSION");
        let have = std::fs::read_to_string(&stamp).unwrap_or_default();
        if have.trim() == GRPCURL_VERSION && bin.is_file() {
            return bin;
        }
        let go = || {
            let mut c = Command::new("go");
            c.env("GOBIN", dir.join("bin"))
                .env("GOCACHE", dir.join("go-cache"))
                .env("GOMODCACHE", dir.join("go-mod"))
                .env("GOFLAGS", "-mod=mod");
            c
        };
        install_step(
            &format!("go install grpcurl {GRPCURL_VERSION} (from the Go module proxy)"),
            go().arg("install").arg(format!(
                "github.com/fullstorydev/grpcurl/cmd/grpcurl@{GRPCURL_VERSION}"
            )),
        );
        std::fs::write(&stamp, format!("{GRPCURL_VERSION}\n")).expect("write the stamp");
        // The stamp makes a rebuild rare; the Go caches are not worth their disk.
        let _ = run(go().args(["clean", "-modcache"]), INSTALL_WAIT);
        let _ = std::fs::remove_dir_all(dir.join("go-cache"));
        bin
    })
}

/// The venv's python with grpcio and grpcio-tools, installed once per checkout into
/// `target/grpcio-venv`.
fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let venv = root().join("target/grpcio-venv");
        let python = venv.join("bin/python");
        let works = || {
            Command::new(&python)
                .args(["-c", "import grpc, grpc_tools.protoc"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if works() {
            return python;
        }
        if venv.exists() {
            std::fs::remove_dir_all(&venv).expect("remove the broken venv");
        }
        install_step(
            "python3 -m venv target/grpcio-venv",
            Command::new("python3").arg("-m").arg("venv").arg(&venv),
        );
        install_step(
            "pip install grpcio grpcio-tools (from PyPI)",
            Command::new(venv.join("bin/pip"))
                .args(["install", "--disable-pip-version-check", "-q"])
                .args(["grpcio", "grpcio-tools"]),
        );
        assert!(works(), "{} cannot import grpc", python.display());
        python
    })
}

/// The example's chain under `zerohop up` with `args`.
fn start(args: &[&str]) -> ChainProcess {
    ChainProcess::start_file(&example("chain.yaml"), args, TempDir::new("grpc"))
}

/// `host:port` of the chain's listener.
fn authority(chain: &ChainProcess) -> String {
    let url = &chain.url;
    url.split_once("://")
        .map_or(url.as_str(), |(_, a)| a)
        .to_owned()
}

/// grpcurl with `args` then `method` on `target`, the example's proto (or `proto`), the
/// request `data`: exit code, output, messages.
fn call(
    target: &str,
    args: &[&str],
    proto: &Path,
    data: &str,
    method: &str,
) -> (Option<i32>, String, String) {
    let (dir, file) = (proto.parent().unwrap(), proto.file_name().unwrap());
    run(
        Command::new(grpcurl())
            .args(["-max-time", "20", "-import-path"])
            .arg(dir)
            .arg("-proto")
            .arg(file)
            .args(args)
            .args(["-d", data, target, method]),
        CALL_WAIT,
    )
}

#[test]
fn grpcurl_calls_a_unary_method_in_clear_and_sees_its_errors_mapped() {
    let proto = example("greeter.proto");
    let chain = start(&[]);
    let target = authority(&chain);
    let plain = ["-plaintext"];

    let (code, out, err) = call(&target, &plain, &proto, r#"{"name": "Ada"}"#, SAY_HELLO);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains(r#""message": "Hello, Ada!""#), "{out}");
    let (code, out, err) = call(
        &target,
        &plain,
        &proto,
        r#"{"name": "Ada", "language": "fr"}"#,
        SAY_HELLO,
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains(r#""message": "Bonjour, Ada!""#), "{out}");

    // A function's 404 and 400: NOT_FOUND and INVALID_ARGUMENT with its message.
    let (code, _, err) = call(
        &target,
        &plain,
        &proto,
        r#"{"name": "Ada", "language": "xx"}"#,
        SAY_HELLO,
    );
    assert_ne!(code, Some(0));
    assert!(err.contains("Code: NotFound"), "{err}");
    assert!(
        err.contains("Message: function 'greeter': no greeting in language `xx`"),
        "{err}"
    );
    let (code, _, err) = call(&target, &plain, &proto, "{}", SAY_HELLO);
    assert_ne!(code, Some(0));
    assert!(err.contains("Code: InvalidArgument"), "{err}");
    assert!(err.contains("name is empty"), "{err}");

    // A second request message: refused, the function never sees it.
    let (code, _, err) = call(
        &target,
        &plain,
        &proto,
        r#"{"name": "a"} {"name": "b"}"#,
        "zerohop.example.Greeter/SayHellos",
    );
    assert_ne!(code, Some(0));
    assert!(err.contains("Code: Unimplemented"), "{err}");
    assert!(err.contains("streaming is not supported"), "{err}");

    // A method of the service that no route takes.
    let dir = TempDir::new("grpc-proto");
    let more = dir.path().join("greeter.proto");
    let text = std::fs::read_to_string(&proto).unwrap().replace(
        "  rpc SayHello(",
        "  rpc SayGoodbye(HelloRequest) returns (HelloReply);\n  rpc SayHello(",
    );
    std::fs::write(&more, text).unwrap();
    let (code, _, err) = call(
        &target,
        &plain,
        &more,
        r#"{"name": "Ada"}"#,
        "zerohop.example.Greeter/SayGoodbye",
    );
    assert_ne!(code, Some(0));
    assert!(err.contains("Code: Unimplemented"), "{err}");
    assert!(
        err.contains("unknown method zerohop.example.Greeter/SayGoodbye"),
        "{err}"
    );
    assert_eq!(chain.stop(), Some(0));
}

/// `openssl` with `args` in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let (code, _, err) = run(
        Command::new("openssl").args(args).current_dir(dir),
        CALL_WAIT,
    );
    assert_eq!(code, Some(0), "openssl {args:?}: {err}");
}

#[test]
fn grpcurl_calls_over_tls_with_a_test_ca() {
    let certs = TempDir::new("grpc-tls");
    let dir = certs.path();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        dir,
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=zerohop grpc CA",
            ],
        ]
        .concat(),
    );
    std::fs::write(
        dir.join("ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            &["req", "-new"][..],
            &ec,
            &[
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=localhost",
            ],
        ]
        .concat(),
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "ext",
        ],
    );
    let (cert, key) = (dir.join("server.pem"), dir.join("server.key"));
    let chain = start(&[
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ]);
    assert!(chain.url.starts_with("https://"), "{}", chain.ready_line);
    let ca = dir.join("ca.pem");
    let tls = ["-cacert", ca.to_str().unwrap(), "-servername", "localhost"];
    let (code, out, err) = call(
        &authority(&chain),
        &tls,
        &example("greeter.proto"),
        r#"{"name": "Ada", "language": "de"}"#,
        SAY_HELLO,
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains(r#""message": "Hallo, Ada!""#), "{out}");
    assert_eq!(chain.stop(), Some(0));
}

/// The Python client: stubs from greeter.proto by grpcio-tools, then each call and what it
/// got, one line each.
const CLIENT: &str = r#"
import sys
import grpc

sys.path.insert(0, sys.argv[1])
import greeter_pb2 as pb
import greeter_pb2_grpc as rpc

def show(what, f):
    try:
        print(what, "ok", f().message)
    except grpc.RpcError as e:
        print(what, e.code().name, e.details())

with grpc.insecure_channel(sys.argv[2]) as channel:
    stub = rpc.GreeterStub(channel)
    show("hello", lambda: stub.SayHello(pb.HelloRequest(name="Ada", language="es"), timeout=20))
    show("unknown-language", lambda: stub.SayHello(pb.HelloRequest(name="Ada", language="xx"), timeout=20))
    # Compressible enough that grpc compresses it (it sends small messages as they are).
    show("compressed", lambda: stub.SayHello(pb.HelloRequest(name="a" * 4000), timeout=20,
                                             compression=grpc.Compression.Gzip))
    show("stream", lambda: stub.SayHellos(iter([pb.HelloRequest(name="a"), pb.HelloRequest(name="b")]), timeout=20))
    raw = channel.unary_unary("/zerohop.example.Greeter/SayGoodbye")
    try:
        raw(b"\n\x03Ada", timeout=20)
        print("unknown-method ok")
    except grpc.RpcError as e:
        print("unknown-method", e.code().name, e.details())
"#;

#[test]
fn a_python_grpcio_client_calls_the_same_method() {
    let python = python();
    let dir = TempDir::new("grpcio");
    let out_dir = dir.path();
    install_step(
        "grpc_tools.protoc on greeter.proto",
        Command::new(python)
            .args(["-m", "grpc_tools.protoc", "-I"])
            .arg(root().join("examples/grpc"))
            .arg(format!("--python_out={}", out_dir.display()))
            .arg(format!("--grpc_python_out={}", out_dir.display()))
            .arg("greeter.proto"),
    );
    let script = out_dir.join("client.py");
    std::fs::write(&script, CLIENT).unwrap();
    let chain = start(&[]);
    let (code, out, err) = run(
        Command::new(python)
            .arg(&script)
            .arg(out_dir)
            .arg(authority(&chain)),
        CALL_WAIT * 2,
    );
    assert_eq!(code, Some(0), "{out}\n{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "hello ok Hola, Ada!",
            "unknown-language NOT_FOUND function 'greeter': no greeting in language `xx`",
            "compressed UNIMPLEMENTED gateway: compression is not supported",
            "stream UNIMPLEMENTED gateway: streaming is not supported",
            "unknown-method UNIMPLEMENTED gateway: unknown method zerohop.example.Greeter/SayGoodbye",
        ],
        "{err}"
    );
    assert_eq!(chain.stop(), Some(0));
}
