// Escape attempts from inside a node instance with what node offers; each entry says
// what happened. The test expects every attempt to fail.
const fs = require("fs");

const field = (name) =>
  fs.readFileSync("/proc/self/status", "utf8").split("\n").find((l) => l.startsWith(name + ":")).split(/\s+/)[1];
const attempt = (fn) => {
  try {
    fn();
    return "ESCAPED";
  } catch (e) {
    return "refused: " + (e.code || e.message);
  }
};

exports.handler = async (event, context) => {
  const victim = Number((context.query.match(/pid=(\d+)/) || [])[1] || 1);
  return {
    uid: process.getuid(),
    processes: fs.readdirSync("/proc").filter((p) => /^\d+$/.test(p)).map(Number),
    cap_eff: field("CapEff"),
    cap_bnd: field("CapBnd"),
    no_new_privs: field("NoNewPrivs"),
    seccomp: field("Seccomp"),
    write_root: attempt(() => fs.writeFileSync("/escape", "x")),
    write_code: attempt(() => fs.writeFileSync("/code/escape", "x")),
    setuid_root: attempt(() => process.setuid(0)),
    kill_target: attempt(() => process.kill(victim, 0)),
    sysrq: attempt(() => fs.writeFileSync("/proc/sysrq-trigger", "h")),
    host_data_dir: fs.existsSync(context.headers["x-data-dir"] || "/nonexistent"),
    // The template's native half must not be reachable from here.
    bootstrap_names: [typeof native, typeof template, typeof serveInstance],
  };
};
