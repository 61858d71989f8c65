// Logs, then dies the way the path asks: past its timeout, out of memory (outside V8's
// heap, so the kernel's OOM killer ends it), by process.exit, or by a signal (abort).
exports.handler = async (event, context) => {
  const kase = context.path.replace(/^\//, "");
  console.log(`node-dying before ${kase}`);
  console.error(`node-dying to stderr before ${kase}`);
  if (kase === "timeout") await new Promise((resolve) => setTimeout(resolve, 30000));
  if (kase === "oom") {
    const hog = [];
    for (;;) hog.push(Buffer.alloc(8 << 20, 1));
  }
  if (kase === "exit") process.exit(3);
  if (kase === "signal") process.abort();
  return "survived";
};
