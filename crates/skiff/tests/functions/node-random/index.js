// What Math.random and crypto draw in this instance; the wait keeps the instance busy,
// so a second call at the same time needs another instance.
const crypto = require("crypto");

exports.handler = async () => {
  const random = [Math.random(), Math.random(), Math.random(), Math.random()];
  const bytes = crypto.randomBytes(16).toString("hex");
  await new Promise((resolve) => setTimeout(resolve, 1000));
  return { random, bytes };
};
