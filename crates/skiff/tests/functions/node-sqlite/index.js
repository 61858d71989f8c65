// better-sqlite3, a native addon, computing with an in-memory database.
const Database = require("better-sqlite3");

exports.handler = async (event) => {
  const db = new Database(":memory:");
  db.exec("CREATE TABLE t (k TEXT, v INTEGER)");
  const insert = db.prepare("INSERT INTO t VALUES (?, ?)");
  for (const [k, v] of event) insert.run(k, v);
  const rows = db.prepare("SELECT k, SUM(v) AS total FROM t GROUP BY k ORDER BY k").all();
  const version = db.prepare("SELECT sqlite_version() AS v").get().v;
  db.close();
  return { rows, version };
};
