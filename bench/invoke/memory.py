"""The memory of a function's template or of one of its instances: PSS and RSS from
/proc/PID/smaps_rollup, and what the daemon reports charged to its cgroup. Prints one
JSON line. Usage: memory.py PORT FUNCTION LABEL ROLE   (ROLE: template | instance)"""
import http.client
import json
import sys

port, function, label, role = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
c.request("GET", "/v1/instances")
listed = [i for i in json.loads(c.getresponse().read()) if i["function"] == function]
match = [i for i in listed if (i.get("role") == "template") == (role == "template")]
if not match:
    sys.exit(f"{label}: no {role} of {function} in {listed}")
i = match[0]
rollup = {}
for line in open(f"/proc/{i['pid']}/smaps_rollup"):
    parts = line.split()
    if len(parts) == 3 and parts[2] == "kB":
        rollup[parts[0].rstrip(":")] = int(parts[1])
print(json.dumps({"label": label, "pss_kb": rollup["Pss"], "rss_kb": rollup["Rss"],
                  "cgroup_kb": i["memory_bytes"] // 1024}))
