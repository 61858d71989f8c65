// semver as package.json and package-lock.json give it: the lock pins an older 7.x than
// the range would resolve to.
const semver = require("semver");

exports.handler = async () => ({
  version: require("semver/package.json").version,
  satisfies: semver.satisfies("1.2.3", "^1.2.0"),
});
