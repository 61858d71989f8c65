exports.handler = async (event, context) => {
  const name = (event && event.name) || "world";
  return { greeting: `hello, ${name}`, runtime: "node" };
};

if (require.main === module) {
  exports.handler({ name: "skiff" }).then((r) => console.log(JSON.stringify(r)));
}
