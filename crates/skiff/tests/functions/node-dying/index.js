// Logs, then dies the way the path asks: past its timeout, out of memory (outside V8's
// heap, so the kernel's OOM killer ends it), by process.exit, by a signal (abort), or by
// an exception nothing catches.
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
  if (kase === "uncaught") {
    // Thrown outside the handler's promise: node ends the process (exit status 1).
    setTimeout(() => {
      throw new Error("node-dying uncaught");
    }, 0);
    await new Promise((resolve) => setTimeout(resolve, 30000));
  }
  return "survived";
};
