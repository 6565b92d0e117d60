"""A signed-in client of the console for bench/operator.sh: one request per connection."""
import http.client


class Console:
    def __init__(self, port, token):
        self.port = port
        self.cookie = None
        answer = self.request("POST", "/console/sign-in", "token=" + token)
        self.cookie = answer.getheader("Set-Cookie").split(";")[0]

    def request(self, method, path, body=None):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Origin": f"http://127.0.0.1:{self.port}",
                   "Content-Type": "application/x-www-form-urlencoded"}
        if self.cookie:
            headers["Cookie"] = self.cookie
        connection.request(method, path, body=body, headers=headers)
        answer = connection.getresponse()
        answer.read()
        connection.close()
        return answer
