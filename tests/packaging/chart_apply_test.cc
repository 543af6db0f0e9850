// The Helm chart's rendered objects on a real kube-apiserver 1.20.2 (KubeTestEnv): every object
// of every value set chart_test.py rendered is accepted (server-side dry run, then created), reads
// back with nothing pruned or changed (an unknown or misplaced field would be dropped silently by
// 1.20), and the operator's ServiceAccount gets exactly the access the operator needs, asked of the
// server's RBAC authorizer through SubjectAccessReviews.
//
// Input: LOCKSTEP_CHART_RENDER_DIR, written by the packaging_chart_render test (ctest fixture):
// crds.json (the chart's CRD), test-crds.json (stand-ins for the Prometheus Operator's and
// Multus' CRDs), defaults.json, monitoring.json, all-options.json.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/kube/kube_testenv.h"
#include "tests/support/process/child_process.h"

namespace lockstep {
namespace {

using json = nlohmann::json;
using testing::KubeTestEnv;

const std::string kRenderDir = LOCKSTEP_CHART_RENDER_DIR;

json ReadJson(const std::string& name) {
  std::ifstream in(kRenderDir + "/" + name);
  std::stringstream text;
  text << in.rdbuf();
  return json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
}

KubeTestEnv* g_kube = nullptr;

class KubeEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    std::string error;
    kube_ = KubeTestEnv::Start({}, &error);
    ASSERT_TRUE(kube_) << error;
    g_kube = kube_.get();
  }
  void TearDown() override {
    g_kube = nullptr;
    kube_.reset();
  }

 private:
  std::unique_ptr<KubeTestEnv> kube_;
};

KubeTestEnv& kube() { return *g_kube; }

// The collection path of an object: /api/v1/namespaces/NS/services, /apis/rbac.../clusterroles.
std::string CollectionPath(const json& object) {
  static const std::map<std::string, std::string> kPlural = {
      {"Deployment", "deployments"},
      {"Pod", "pods"},  // the `helm test` hook
      {"Service", "services"},
      {"ServiceAccount", "serviceaccounts"},
      {"ConfigMap", "configmaps"},
      {"ClusterRole", "clusterroles"},
      {"ClusterRoleBinding", "clusterrolebindings"},
      {"Role", "roles"},
      {"RoleBinding", "rolebindings"},
      {"ServiceMonitor", "servicemonitors"},
      {"PodMonitor", "podmonitors"},
      {"PrometheusRule", "prometheusrules"},
      {"NetworkAttachmentDefinition", "network-attachment-definitions"},
      {"CustomResourceDefinition", "customresourcedefinitions"},
      {"Namespace", "namespaces"},
      {"ValidatingWebhookConfiguration", "validatingwebhookconfigurations"},
  };
  const std::string api_version = object.value("apiVersion", "");
  const std::string kind = object.value("kind", "");
  auto plural = kPlural.find(kind);
  if (plural == kPlural.end()) return "";
  std::string path =
      api_version.find('/') == std::string::npos ? "/api/" + api_version : "/apis/" + api_version;
  const json& metadata = object["metadata"];
  if (metadata.contains("namespace")) {
    path += "/namespaces/" + metadata["namespace"].get<std::string>();
  }
  return path + "/" + plural->second;
}

// Every field of `sent` is in `got` with the same value (the server may add fields).
void ExpectSubset(const json& sent, const json& got, const std::string& where) {
  if (sent.is_object()) {
    ASSERT_TRUE(got.is_object()) << where << ": sent an object, read back " << got.dump();
    for (auto it = sent.begin(); it != sent.end(); ++it) {
      ASSERT_TRUE(got.contains(it.key()))
          << where << "." << it.key() << " was dropped by the server (unknown or misplaced)";
      ExpectSubset(it.value(), got[it.key()], where + "." + it.key());
    }
  } else if (sent.is_array()) {
    ASSERT_TRUE(got.is_array() && got.size() == sent.size()) << where << ": " << got.dump();
    for (size_t i = 0; i < sent.size(); ++i) {
      ExpectSubset(sent[i], got[i], where + "[" + std::to_string(i) + "]");
    }
  } else if (sent.is_number() && got.is_number()) {
    EXPECT_EQ(sent.get<double>(), got.get<double>()) << where;
  } else {
    EXPECT_EQ(sent, got) << where;
  }
}

void EnsureNamespace(const std::string& name) {
  auto created =
      kube().Request("POST", "/api/v1/namespaces",
                     {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", name}}}});
  ASSERT_TRUE(created.status == 201 || created.status == 409) << created.raw;
}

void CreateCrd(const json& crd) {
  const std::string path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
  auto created = kube().Request("POST", path, crd);
  ASSERT_TRUE(created.status == 201 || created.status == 409) << created.raw;
  const std::string name = crd["metadata"]["name"];
  bool established = KubeTestEnv::WaitFor(
      [&] {
        auto got = kube().Request("GET", path + "/" + name);
        for (const auto& condition : got.body["status"].value("conditions", json::array())) {
          if (condition.value("type", "") == "Established" &&
              condition.value("status", "") == "True") {
            return true;
          }
        }
        return false;
      },
      30000);
  ASSERT_TRUE(established) << name << " never became Established";
}

class ChartApplyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    for (const char* file : {"crds.json", "test-crds.json"}) {
      json crds = ReadJson(file);
      ASSERT_TRUE(crds.is_object())
          << kRenderDir << "/" << file << " missing: run the packaging_chart_render test first";
      for (const auto& entry : crds["objects"]) CreateCrd(entry["object"]);
    }
  }

  // Applies one rendered value set: dry run first (what `helm install --dry-run=server` would
  // ask), then for real, then reads each object back.
  // Each set is applied once per process (the RBAC test needs the defaults whichever test runs
  // first).
  static void ApplyRenderedSet(const std::string& file) {
    static std::set<std::string> applied_sets;
    if (!applied_sets.insert(file).second) return;
    json rendered = ReadJson(file);
    ASSERT_TRUE(rendered.is_object()) << file << " missing: run packaging_chart_render first";
    std::set<std::string> namespaces{rendered["namespace"].get<std::string>()};
    for (const auto& entry : rendered["objects"]) {
      const json& metadata = entry["object"]["metadata"];
      if (metadata.contains("namespace")) namespaces.insert(metadata["namespace"]);
    }
    for (const auto& ns : namespaces) EnsureNamespace(ns);
    int applied = 0;
    for (const auto& entry : rendered["objects"]) {
      const json& object = entry["object"];
      const std::string where = file + ": " + entry["source"].get<std::string>() + ": " +
                                object["kind"].get<std::string>() + " " +
                                object["metadata"]["name"].get<std::string>();
      SCOPED_TRACE(where);
      const std::string collection = CollectionPath(object);
      ASSERT_FALSE(collection.empty()) << "no API path known for " << object["kind"];
      auto dry_run = kube().Request("POST", collection + "?dryRun=All", object);
      ASSERT_EQ(dry_run.status, 201) << dry_run.raw;
      auto created = kube().Request("POST", collection, object);
      ASSERT_EQ(created.status, 201) << created.raw;
      auto got =
          kube().Request("GET", collection + "/" + object["metadata"]["name"].get<std::string>());
      ASSERT_EQ(got.status, 200) << got.raw;
      json read_back = got.body;
      if (object["kind"] == "Pod") {
        // The DefaultTolerationSeconds admission plugin adds 300 s not-ready and unreachable
        // tolerations to a pod that has none of its own: the server's, not the chart's.
        json& tolerations = read_back["spec"]["tolerations"];
        json kept = json::array();
        for (const json& t : tolerations) {
          const std::string key = t.value("key", "");
          if ((key == "node.kubernetes.io/not-ready" || key == "node.kubernetes.io/unreachable") &&
              t.value("tolerationSeconds", 0) == 300) {
            continue;
          }
          kept.push_back(t);
        }
        if (kept.empty()) {
          read_back["spec"].erase("tolerations");
        } else {
          tolerations = kept;
        }
      }
      ExpectSubset(object, read_back, where);
      ++applied;
    }
    EXPECT_GE(applied, 8) << file;
  }
};

TEST_F(ChartApplyTest, DefaultValuesApply) { ApplyRenderedSet("defaults.json"); }
TEST_F(ChartApplyTest, MonitoringObjectsApply) { ApplyRenderedSet("monitoring.json"); }
TEST_F(ChartApplyTest, EveryOptionSetApplies) { ApplyRenderedSet("all-options.json"); }

// What the RBAC authorizer answers for the operator's ServiceAccount of the default release.
bool Allowed(const std::string& verb, const std::string& group, const std::string& resource,
             const std::string& ns, const std::string& name = "",
             const std::string& subresource = "") {
  const std::string account_ns = "lockstep-system";
  json attributes = {{"verb", verb}, {"group", group}, {"resource", resource}};
  if (!ns.empty()) attributes["namespace"] = ns;
  if (!name.empty()) attributes["name"] = name;
  if (!subresource.empty()) attributes["subresource"] = subresource;
  json review = {{"apiVersion", "authorization.k8s.io/v1"},
                 {"kind", "SubjectAccessReview"},
                 {"spec",
                  {{"user", "system:serviceaccount:" + account_ns + ":lockstep"},
                   {"groups",
                    {"system:serviceaccounts", "system:serviceaccounts:" + account_ns,
                     "system:authenticated"}},
                   {"resourceAttributes", attributes}}}};
  auto answer =
      kube().Request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review);
  EXPECT_EQ(answer.status, 201) << answer.raw;
  return answer.body["status"].value("allowed", false);
}

TEST_F(ChartApplyTest, OperatorServiceAccountHasExactlyWhatTheOperatorNeeds) {
  ApplyRenderedSet("defaults.json");
  const std::string own = "lockstep-system";
  const std::string team = "team-a";  // any namespace with jobs
  // What the operator does (docs/operations.md, "RBAC").
  for (const char* verb : {"get", "list", "watch", "update", "patch", "delete"}) {
    EXPECT_TRUE(Allowed(verb, "lockstep.io", "trainingjobs", team)) << verb;
  }
  EXPECT_TRUE(Allowed("list", "lockstep.io", "trainingjobs", ""));  // cluster-wide watch
  EXPECT_TRUE(Allowed("update", "lockstep.io", "trainingjobs", team, "job", "status"));
  EXPECT_TRUE(Allowed("patch", "lockstep.io", "trainingjobs", team, "job", "status"));
  for (const char* verb : {"get", "list", "watch", "create", "delete", "patch"}) {
    EXPECT_TRUE(Allowed(verb, "", "pods", team)) << verb;
  }
  EXPECT_TRUE(Allowed("patch", "", "pods", own, "lockstep-operator-abc"));  // the leader label
  for (const char* verb : {"get", "list", "watch", "create", "delete"}) {
    EXPECT_TRUE(Allowed(verb, "", "services", team)) << verb;
    EXPECT_TRUE(Allowed(verb, "scheduling.volcano.sh", "podgroups", team)) << verb;
    EXPECT_TRUE(Allowed(verb, "scheduling.x-k8s.io", "podgroups", team)) << verb;
  }
  EXPECT_TRUE(Allowed("create", "", "secrets", team));  // a job's rendezvous Secret
  EXPECT_TRUE(Allowed("create", "", "events", team));
  EXPECT_TRUE(Allowed("patch", "", "events", team));
  EXPECT_TRUE(Allowed("get", "", "secrets", own, "lockstep-operator"));
  EXPECT_TRUE(Allowed("update", "", "secrets", own, "lockstep-operator"));
  EXPECT_TRUE(Allowed("create", "", "secrets", own));
  EXPECT_TRUE(Allowed("get", "coordination.k8s.io", "leases", own, "lockstep-operator"));
  EXPECT_TRUE(Allowed("update", "coordination.k8s.io", "leases", own, "lockstep-operator"));
  EXPECT_TRUE(Allowed("create", "coordination.k8s.io", "leases", own));
  // Its own webhook configuration's caBundle.
  EXPECT_TRUE(Allowed("get", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "",
                      "lockstep"));
  EXPECT_TRUE(Allowed("update", "admissionregistration.k8s.io", "validatingwebhookconfigurations",
                      "", "lockstep"));

  // What it must not do: read Secrets it did not create, or anything beyond the list above.
  EXPECT_FALSE(Allowed("get", "", "secrets", team, "job-rendezvous"));
  EXPECT_FALSE(Allowed("list", "", "secrets", team));
  EXPECT_FALSE(Allowed("list", "", "secrets", own));
  EXPECT_FALSE(Allowed("watch", "", "secrets", own));
  EXPECT_FALSE(Allowed("get", "", "secrets", own, "another-secret"));
  EXPECT_FALSE(Allowed("delete", "", "secrets", own, "lockstep-operator"));
  EXPECT_FALSE(Allowed("update", "", "secrets", team, "lockstep-operator"));
  EXPECT_FALSE(Allowed("get", "coordination.k8s.io", "leases", team, "lockstep-operator"));
  EXPECT_FALSE(Allowed("update", "coordination.k8s.io", "leases", own, "kube-scheduler"));
  EXPECT_FALSE(Allowed("create", "lockstep.io", "trainingjobs", team));
  EXPECT_FALSE(Allowed("update", "", "pods", team));
  EXPECT_FALSE(Allowed("update", "", "services", team));
  EXPECT_FALSE(Allowed("create", "apps", "deployments", team));
  EXPECT_TRUE(Allowed("get", "", "nodes", "")) << "a lost node's pods";
  EXPECT_TRUE(Allowed("list", "", "nodes", "")) << "whether any node carries a placement level";
  EXPECT_FALSE(Allowed("watch", "", "nodes", ""));
  EXPECT_FALSE(Allowed("update", "", "nodes", ""));
  EXPECT_FALSE(Allowed("get", "", "configmaps", own));
  EXPECT_FALSE(Allowed("create", "rbac.authorization.k8s.io", "clusterrolebindings", ""));
  EXPECT_FALSE(Allowed("create", "", "pods", team, "", "exec"));
  EXPECT_FALSE(Allowed("update", "admissionregistration.k8s.io", "validatingwebhookconfigurations",
                       "", "another-webhook"));
  EXPECT_FALSE(
      Allowed("list", "admissionregistration.k8s.io", "validatingwebhookconfigurations", ""));
  EXPECT_FALSE(
      Allowed("create", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", ""));
}

// A namespace's users, with nothing but the built-in roles an admin hands out: the chart's
// ClusterRoles reach them through kube-controller-manager's clusterrole-aggregation controller,
// as in a cluster. Each request is the user's own (impersonated), judged by the real authorizer.
TEST_F(ChartApplyTest, NamespaceUsersWithEditRunJobsAndWithViewOnlyWatchThem) {
  ApplyRenderedSet("defaults.json");
  std::string error;
  ASSERT_TRUE(kube().StartControllerManager({"clusterrole-aggregation"}, &error)) << error;
  // The chart's webhooks call a Service no operator backs here (admission_webhook_test runs the
  // real one): let TrainingJob writes through as failurePolicy Ignore does, so that what decides
  // below is RBAC alone.
  const std::string webhooks =
      "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";
  const KubeTestEnv::Response configurations = kube().Request("GET", webhooks);
  ASSERT_FALSE(configurations.body["items"].empty()) << configurations.raw;
  for (const json& configuration : configurations.body["items"]) {
    const std::string name = configuration["metadata"]["name"];
    auto patched = kube().Request(
        "PATCH", webhooks + "/" + name,
        json::array(
            {{{"op", "replace"}, {"path", "/webhooks/0/failurePolicy"}, {"value", "Ignore"}}}),
        "application/json-patch+json");
    ASSERT_EQ(patched.status, 200) << patched.raw;
  }
  // The built-in edit role gains the chart's rules once the controller has aggregated them.
  bool aggregated = KubeTestEnv::WaitFor(
      [] {
        // Each built-in role is aggregated on its own.
        for (const char* role : {"edit", "view"}) {
          auto got = kube().Request(
              "GET", std::string("/apis/rbac.authorization.k8s.io/v1/clusterroles/") + role);
          if (got.raw.find("trainingjobs/scale") == std::string::npos) return false;
        }
        return true;
      },
      30000);
  ASSERT_TRUE(aggregated) << "edit or view never gained trainingjobs:\n" << kube().LogTails();

  const std::string team = "team-users", other = "team-others";
  EnsureNamespace(team);
  EnsureNamespace(other);
  for (const auto& [account, role] :
       {std::pair<std::string, std::string>{"alice", "edit"}, {"bob", "view"}}) {
    auto created = kube().Request(
        "POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/" + team + "/rolebindings",
        {{"apiVersion", "rbac.authorization.k8s.io/v1"},
         {"kind", "RoleBinding"},
         {"metadata", {{"name", account + "-" + role}}},
         {"roleRef",
          {{"apiGroup", "rbac.authorization.k8s.io"}, {"kind", "ClusterRole"}, {"name", role}}},
         {"subjects", {{{"kind", "ServiceAccount"}, {"name", account}, {"namespace", team}}}}});
    ASSERT_EQ(created.status, 201) << created.raw;
  }
  const KubeTestEnv::Identity alice = KubeTestEnv::ServiceAccountIdentity(team, "alice");
  const KubeTestEnv::Identity bob = KubeTestEnv::ServiceAccountIdentity(team, "bob");
  auto jobs = [](const std::string& ns) {
    return "/apis/lockstep.io/v1alpha1/namespaces/" + ns + "/trainingjobs";
  };
  const json job = {{"apiVersion", "lockstep.io/v1alpha1"},
                    {"kind", "TrainingJob"},
                    {"metadata", {{"name", "mine"}}},
                    {"spec",
                     {{"replicas", 2},
                      {"elastic", {{"minReplicas", 1}, {"maxReplicas", 4}}},
                      {"command", {"python3", "train.py"}}}}};

  // The API server applies the patched policies from its own watch, a moment later.
  KubeTestEnv::Response dry_run;
  bool ignored = KubeTestEnv::WaitFor(
      [&] {
        dry_run = kube().Request("POST", jobs(team) + "?dryRun=All", job);
        return dry_run.status == 201;
      },
      30000);
  ASSERT_TRUE(ignored) << dry_run.raw;

  // edit: create, scale, suspend, read, delete, in its namespace only.
  auto created = kube().RequestAs(alice, "POST", jobs(team), job);
  ASSERT_EQ(created.status, 201) << created.raw;
  EXPECT_EQ(kube()
                .RequestAs(alice, "PATCH", jobs(team) + "/mine/scale",
                           {{"spec", {{"replicas", 3}}}}, "application/merge-patch+json")
                .status,
            200);
  EXPECT_EQ(kube()
                .RequestAs(alice, "PATCH", jobs(team) + "/mine",
                           {{"spec", {{"runPolicy", {{"suspend", true}}}}}},
                           "application/merge-patch+json")
                .status,
            200);
  EXPECT_EQ(kube().RequestAs(alice, "GET", jobs(team) + "/mine/status").status, 200);
  EXPECT_EQ(kube().RequestAs(alice, "POST", jobs(other), job).status, 403);
  EXPECT_EQ(kube().RequestAs(alice, "GET", jobs(other)).status, 403);
  EXPECT_EQ(kube()
                .RequestAs(alice, "PATCH", jobs(other) + "/mine/scale",
                           {{"spec", {{"replicas", 3}}}}, "application/merge-patch+json")
                .status,
            403);
  EXPECT_EQ(kube().RequestAs(alice, "DELETE", jobs(other) + "/mine").status, 403);
  // Status is the operator's to write.
  EXPECT_EQ(kube()
                .RequestAs(alice, "PATCH", jobs(team) + "/mine/status",
                           {{"status", {{"phase", "Succeeded"}}}}, "application/merge-patch+json")
                .status,
            403);

  // view: get, list and watch; nothing else.
  EXPECT_EQ(kube().RequestAs(bob, "GET", jobs(team)).status, 200);
  EXPECT_EQ(kube().RequestAs(bob, "GET", jobs(team) + "/mine").status, 200);
  EXPECT_EQ(kube().RequestAs(bob, "GET", jobs(team) + "?watch=true&timeoutSeconds=1").status, 200);
  EXPECT_EQ(kube().RequestAs(bob, "GET", jobs(team) + "/mine/scale").status, 200);
  json second = job;
  second["metadata"]["name"] = "bobs";
  EXPECT_EQ(kube().RequestAs(bob, "POST", jobs(team), second).status, 403);
  EXPECT_EQ(kube()
                .RequestAs(bob, "PATCH", jobs(team) + "/mine/scale", {{"spec", {{"replicas", 1}}}},
                           "application/merge-patch+json")
                .status,
            403);
  EXPECT_EQ(kube().RequestAs(bob, "DELETE", jobs(team) + "/mine").status, 403);
  EXPECT_EQ(kube().RequestAs(bob, "GET", jobs(other)).status, 403);

  EXPECT_EQ(kube().RequestAs(alice, "DELETE", jobs(team) + "/mine").status, 200);
}

// Helm installs crds/ once and never upgrades it, so docs/operations.md tells a user to apply the
// chart's CRD with kubectl before `helm upgrade`. Played here on a server of its own (ctest runs
// this case alone: chart_crd_upgrade_test): the CRD of an earlier chart created as Helm creates it,
// a user's job stored under it, then today's chart CRD applied with the documented command. The
// job stays as it was, and what the new schema adds (status.progress.display, which the new
// printer columns read) is kept where the old schema pruned it, as `kubectl get` shows.
TEST(CrdUpgradeTest, TheChartsCrdAppliedOverAnEarlierOneKeepsItsJobsAndServesTheNewFields) {
  const std::string source = LOCKSTEP_SOURCE_DIR;
  auto kubectl = [](std::vector<std::string> args) {
    args.insert(args.begin(), {LOCKSTEP_KUBECTL, "--kubeconfig", kube().kubeconfig()});
    return testing::RunProcess(args, {}, 60000);
  };
  const std::string crd_path =
      "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/trainingjobs.lockstep.io";
  // Established, and the version's printer columns as the server serves them.
  auto printer_columns = [&] {
    auto got = kube().Request("GET", crd_path);
    for (const auto& condition : got.body["status"].value("conditions", json::array())) {
      if (condition.value("type", "") == "Established" && condition.value("status", "") == "True") {
        return got.body["spec"]["versions"][0]["additionalPrinterColumns"].dump();
      }
    }
    return std::string();
  };
  const std::string kDisplayColumn = ".status.progress.display.samplesPerSecond";

  // The earlier chart's CRD, created (not applied) as Helm creates crds/.
  testing::ProcessResult created =
      kubectl({"create", "-f", source + "/tests/packaging/crd_upgrade/trainingjob-d7472bd.yaml"});
  ASSERT_EQ(created.exit_code, 0) << created.out << created.err;
  ASSERT_TRUE(KubeTestEnv::WaitFor([&] { return !printer_columns().empty(); }, 30000));
  ASSERT_EQ(printer_columns().find(kDisplayColumn), std::string::npos)
      << "the earlier CRD already reads status.progress.display: " << printer_columns();

  // A user's job under it, with the status an operator of that time wrote.
  EnsureNamespace("upgrade");
  const std::string jobs = "/apis/lockstep.io/v1alpha1/namespaces/upgrade/trainingjobs";
  bool served = KubeTestEnv::WaitFor(
      [&] {
        testing::ProcessResult applied =
            kubectl({"apply", "-n", "upgrade", "-f", source + "/examples/digits.yaml"});
        return applied.exit_code == 0;
      },
      30000);
  ASSERT_TRUE(served) << "kubectl apply of examples/digits.yaml under the earlier CRD failed";
  const json display = {{"samplesPerSecond", "37604"}, {"scalingEfficiency", "16%"}};
  const json status = {{"status",
                        {{"phase", "Running"},
                         {"progress",
                          {{"step", 300}, {"samplesPerSecond", 37603.77}, {"display", display}}}}}};
  auto patched =
      kube().Request("PATCH", jobs + "/digits/status", status, "application/merge-patch+json");
  ASSERT_EQ(patched.status, 200) << patched.raw;
  ASSERT_FALSE(patched.body["status"]["progress"].contains("display"))
      << "the earlier schema should prune a field it does not know: " << patched.raw;
  const json spec_before = kube().Request("GET", jobs + "/digits").body["spec"];

  // The documented upgrade: today's chart CRD, applied over the one Helm created.
  testing::ProcessResult applied =
      kubectl({"apply", "-f", source + "/charts/lockstep/crds/trainingjob.yaml"});
  ASSERT_EQ(applied.exit_code, 0) << applied.out << applied.err;
  ASSERT_TRUE(KubeTestEnv::WaitFor(
      [&] { return printer_columns().find(kDisplayColumn) != std::string::npos; }, 30000))
      << printer_columns();

  // The job is as it was, and the new field is kept (the server may take a moment to serve the
  // new schema for the resource: bounded).
  auto job = kube().Request("GET", jobs + "/digits");
  ASSERT_EQ(job.status, 200) << job.raw;
  EXPECT_EQ(job.body["spec"], spec_before);
  EXPECT_EQ(job.body["status"]["progress"]["step"], 300);
  bool kept = KubeTestEnv::WaitFor(
      [&] {
        auto again =
            kube().Request("PATCH", jobs + "/digits/status", status, "application/merge-patch+json");
        return again.status == 200 && again.body["status"]["progress"].value("display", json()) ==
                                          display;
      },
      30000);
  ASSERT_TRUE(kept) << kube().Request("GET", jobs + "/digits").raw;
  testing::ProcessResult listed = kubectl({"get", "trainingjobs", "-n", "upgrade"});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_NE(listed.out.find("37604"), std::string::npos) << listed.out;
  EXPECT_NE(listed.out.find("16%"), std::string::npos) << listed.out;
  std::cout << listed.out;
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new lockstep::KubeEnvironment());
  return RUN_ALL_TESTS();
}
