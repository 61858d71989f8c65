// The sandbox as an instance sees it, in the same words as py-entry's: the test expects
// the same answer from every cold path and both runtimes.
const fs = require("fs");

const STATUS = ["Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"];
const LIMITS = ["Max open files", "Max core file size"];
const lines = (file) => fs.readFileSync(file, "utf8").split("\n").filter((l) => l);
const words = (s) => s.split(/\s+/).filter((w) => w).join(" ");

exports.handler = async () => {
  const status = Object.fromEntries(lines("/proc/self/status").map((l) => [l.slice(0, l.indexOf(":")), l.slice(l.indexOf(":") + 1)]));
  const mounts = lines("/proc/self/mountinfo").map((line) => {
    const [head, tail] = line.split(" - ");
    const fields = head.split(" ");
    const rest = tail.split(" ");
    // Mount point, its options, file system type, super block options.
    return [fields[4], fields[5], rest[0], rest[2]].join(" ");
  });
  let root;
  try {
    fs.writeFileSync("/root-is-writable", "x");
    root = "writable";
  } catch (e) {
    root = e.code;
  }
  return {
    status: Object.fromEntries(STATUS.map((k) => [k, words(status[k])])),
    limits: lines("/proc/self/limits").filter((l) => LIMITS.some((p) => l.startsWith(p))).map(words),
    mounts: mounts.sort(),
    root,
    cwd: process.cwd(),
  };
};
