// The node handler contract: what the handler sees of the request, what it returns.
exports.handler = async (event, context) => {
  console.log(`node-contract saw ${context.method} ${context.path}`);
  console.error("node-contract to stderr");
  if (context.path === "/raise") throw new Error("node-contract raised on purpose");
  if (context.path === "/status") {
    return { statusCode: 201, headers: { "X-From-Handler": "node" }, body: { created: true } };
  }
  return {
    event,
    method: context.method,
    path: context.path,
    query: context.query,
    header: context.headers["x-test"] ?? null,
    request_id: context.requestId,
  };
};
