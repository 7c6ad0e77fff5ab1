'use strict';
// Builds the native addon: `cargo build --release` of this folder's crate, then copies the
// library it makes to zerohop.node (what index.js loads). The cargo target folder is
// $CARGO_TARGET_DIR when set, else ./target.
//
//   npm run build

const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const here = __dirname;
const target = process.env.CARGO_TARGET_DIR
  ? path.resolve(process.env.CARGO_TARGET_DIR)
  : path.join(here, 'target');
// zerohop runs on Linux only (package.json's `os`; the runtime uses prctl and memfd).
if (process.platform !== 'linux') {
  console.error(`build.js: zerohop runs on Linux only, not on ${process.platform}`);
  process.exit(1);
}

try {
  execFileSync(
    'cargo',
    ['build', '--release', '--manifest-path', path.join(here, 'Cargo.toml'), '--target-dir', target],
    { stdio: 'inherit' },
  );
} catch (e) {
  console.error(
    e.code === 'ENOENT'
      ? 'build.js: `cargo` is not on PATH; the addon is built from Rust (https://rustup.rs)'
      : `build.js: cargo build failed (${e.status ?? e.message})`,
  );
  process.exit(1);
}

// Copied beside, then renamed over: a process that has the old addon loaded keeps its copy.
const built = path.join(target, 'release', 'libzerohop_node.so');
const out = path.join(here, 'zerohop.node');
const tmp = `${out}.${process.pid}.tmp`;
fs.copyFileSync(built, tmp);
fs.chmodSync(tmp, 0o755);
fs.renameSync(tmp, out);
console.log(`build.js: ${path.relative(process.cwd(), out) || out} from ${built}`);
